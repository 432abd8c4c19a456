"""The proxy's upstream calls over a real socket: both HTTP clients (aiohttp, the default, and
httpx) against a scripted model server on 127.0.0.1 that fails, hangs, throttles, streams and
cuts streams off. Whatever the client, the agent gets the same statuses, every try is counted,
``Retry-After`` is honoured, and streamed text is passed on line by line."""

from __future__ import annotations

import asyncio
import email.utils
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from keeper_middleware.integrations.proxy.chat_completions.streams import StreamPiece
from keeper_middleware.integrations.proxy.cli import serve_in_thread
from keeper_middleware.integrations.proxy.upstream.client import (
    CallTally,
    RetryPolicy,
    Upstream,
    UpstreamError,
)
from keeper_middleware.integrations.proxy.upstream.http_clients import (
    AiohttpClient,
    HttpxClient,
    env_proxy,
    split_lines,
)

pytestmark = pytest.mark.anyio

Action = Callable[[Request], Any]
BODY = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}


def completion(text: str) -> dict[str, Any]:
    return {
        "id": "c1",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }


def answer(text: str) -> Action:
    return lambda request: JSONResponse(completion(text))


def status(code: int, headers: dict[str, str] | None = None, message: str = "no") -> Action:
    return lambda request: JSONResponse({"error": {"message": message}}, code, headers)


def hang(request: Request) -> Any:
    async def until_gone() -> Response:
        while not await request.is_disconnected():
            await asyncio.sleep(0.05)
        return Response(b"")

    return until_gone()


def events(*lines: str, chunk: int = 7, fail_after: int | None = None) -> Action:
    """An event stream sent in small pieces (lines split across pieces), optionally cut off."""
    data = "".join(lines).encode()

    async def pieces() -> AsyncIterator[bytes]:
        for start in range(0, len(data), chunk):
            if fail_after is not None and start >= fail_after:
                raise RuntimeError("the model server died mid-stream")
            yield data[start : start + chunk]
            await asyncio.sleep(0)

    return lambda request: StreamingResponse(pieces(), media_type="text/event-stream")


def delta(text: str) -> str:
    chunk = {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"content": text}}]}
    return f"data: {json.dumps(chunk)}\r\n\r\n"


FINISH = (
    'data: {"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\r\n\r\n'
)


class ScriptedServer:
    """Answers each chat request with the next action of ``script`` (the last one repeats)."""

    def __init__(self, *script: Action) -> None:
        self.script = list(script)
        self.requests: list[dict[str, str]] = []

    def app(self) -> Starlette:
        async def chat(request: Request) -> Response:
            await request.body()
            self.requests.append(dict(request.headers))
            action = self.script.pop(0) if len(self.script) > 1 else self.script[0]
            reply = action(request)
            return await reply if asyncio.iscoroutine(reply) else reply

        return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


@contextmanager
def serving(server: ScriptedServer) -> Iterator[str]:
    with serve_in_thread(server.app()) as url:
        yield url


QUICK = RetryPolicy(attempts=4, first_wait=0.0, max_wait=0.0, budget=30.0, timeout=10.0)


@pytest.fixture(params=["aiohttp", "httpx"])
def client_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def upstream_at(url: str, kind: str, retry: RetryPolicy = QUICK) -> Upstream:
    upstream = Upstream(url, api_key="upstream-key", forward_auth=False, retry=retry)
    if kind == "httpx":  # the network through httpx, as without aiohttp installed
        upstream.client = HttpxClient(timeout=retry.timeout)
    assert isinstance(upstream.client, AiohttpClient if kind == "aiohttp" else HttpxClient)
    return upstream


async def test_aiohttp_is_the_default_client_and_httpx_serves_injected_transports():
    import httpx

    plain = Upstream("http://127.0.0.1:1/v1", api_key=None, forward_auth=True, retry=QUICK)
    mocked = Upstream(
        "http://127.0.0.1:1/v1",
        api_key=None,
        forward_auth=True,
        retry=QUICK,
        transport=httpx.MockTransport(lambda request: httpx.Response(200)),
    )
    assert isinstance(plain.client, AiohttpClient) and isinstance(mocked.client, HttpxClient)
    await plain.aclose()
    await mocked.aclose()


async def test_failures_are_tried_again_and_every_try_counted(client_kind):
    server = ScriptedServer(
        status(500), status(429, {"retry-after": "0"}), status(503), answer("finally")
    )
    with serving(server) as url:
        upstream = upstream_at(url, client_kind)
        tally = CallTally()
        data = (await upstream.complete(BODY, auth=None, tally=tally)).data
        await upstream.aclose()
    assert data["choices"][0]["message"]["content"] == "finally"
    assert (tally.calls, tally.failures, tally.retries) == (4, 3, 3)
    assert len(server.requests) == 4
    assert {r["authorization"] for r in server.requests} == {"Bearer upstream-key"}


async def test_the_last_failure_reaches_the_agent_when_tries_run_out(client_kind):
    server = ScriptedServer(status(500, message="kaput"))
    with serving(server) as url:
        upstream = upstream_at(url, client_kind, RetryPolicy(attempts=3, first_wait=0, max_wait=0))
        tally = CallTally()
        with pytest.raises(UpstreamError) as failed:
            await upstream.complete(BODY, auth=None, tally=tally)
        await upstream.aclose()
    assert (failed.value.status, failed.value.code) == (502, "upstream_error")
    assert "kaput" in failed.value.message
    assert (tally.calls, tally.failures, tally.retries) == (3, 3, 2)


@pytest.mark.parametrize("form", ["seconds", "http-date"])
async def test_a_retry_after_past_the_budget_ends_the_tries_and_is_passed_on(client_kind, form):
    later = time.time() + 3600
    retry_after = "3600" if form == "seconds" else email.utils.formatdate(later, usegmt=True)
    server = ScriptedServer(status(429, {"retry-after": retry_after}), answer("too late"))
    policy = RetryPolicy(attempts=4, first_wait=0, max_wait=0, budget=60)
    with serving(server) as url:
        upstream = upstream_at(url, client_kind, policy)
        with pytest.raises(UpstreamError) as failed:
            await upstream.complete(BODY, auth=None, tally=CallTally())
        await upstream.aclose()
    assert (failed.value.status, failed.value.code) == (429, "upstream_overloaded")
    assert failed.value.retry_after is not None and failed.value.retry_after > 3000
    assert len(server.requests) == 1  # waiting as asked would pass the 60 s budget


async def test_a_hung_upstream_is_a_504_after_the_timeout(client_kind):
    server = ScriptedServer(hang)
    policy = RetryPolicy(attempts=2, first_wait=0, max_wait=0, timeout=0.3)
    with serving(server) as url:
        upstream = upstream_at(url, client_kind, policy)
        tally = CallTally()
        with pytest.raises(UpstreamError) as failed:
            await upstream.complete(BODY, auth=None, tally=tally)
        await upstream.aclose()
    assert (failed.value.status, failed.value.code) == (504, "upstream_timeout")
    assert (tally.calls, tally.failures) == (2, 2)


async def test_an_unreachable_upstream_is_a_502(client_kind):
    with serving(ScriptedServer(answer("x"))) as url:
        pass  # the port is closed again
    upstream = upstream_at(url, client_kind, RetryPolicy(attempts=2, first_wait=0, max_wait=0))
    tally = CallTally()
    with pytest.raises(UpstreamError) as failed:
        await upstream.complete(BODY, auth=None, tally=tally)
    await upstream.aclose()
    assert (failed.value.status, failed.value.code) == (502, "upstream_unavailable")
    assert url.split("//")[1].split("/")[0] in failed.value.message
    assert (tally.calls, tally.failures) == (2, 2)


async def test_a_rejection_is_passed_on_once_with_its_message(client_kind):
    server = ScriptedServer(status(400, message="tool schema invalid"))
    with serving(server) as url:
        upstream = upstream_at(url, client_kind)
        tally = CallTally()
        with pytest.raises(UpstreamError) as failed:
            await upstream.complete(BODY, auth=None, tally=tally)
        await upstream.aclose()
    assert (failed.value.status, failed.value.code) == (400, "upstream_rejected")
    assert "tool schema invalid" in failed.value.message
    assert (tally.calls, len(server.requests)) == (1, 1)


async def streamed_through(
    server: ScriptedServer, kind: str
) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """The deltas passed on as a stream came, and the completion made of it."""
    forwarded: list[dict[str, str]] = []

    async def forward(part: StreamPiece) -> None:
        forwarded.append(part.delta)

    with serving(server) as url:
        upstream = upstream_at(url, kind)
        data = (await upstream.complete(BODY, auth=None, tally=CallTally(), forward=forward)).data
        await upstream.aclose()
    return forwarded, data


async def test_streamed_text_is_passed_on_as_it_arrives_long_lines_too(client_kind):
    long_piece = "ä" * 200_000  # one event line far past aiohttp's own line limit
    pieces = ["Hel", "lo, ", long_piece, " wörld"]
    stream = [*(delta(p) for p in pieces), FINISH, "data: [DONE]\r\n\r\n"]
    server = ScriptedServer(events(*stream, chunk=997))  # pieces end mid-line, mid-character
    forwarded, data = await streamed_through(server, client_kind)
    assert "".join(p["content"] for p in forwarded) == "".join(pieces)
    assert data["choices"][0]["message"]["content"] == "".join(pieces)
    assert data["choices"][0]["finish_reason"] == "stop"


async def test_an_event_whose_data_spans_several_lines_is_read_whole(client_kind):
    """SSE lets an event carry its data on several ``data:`` lines (joined with newlines), with
    comments, ``event:`` and ``id:`` fields around them; JSON may be split at any whitespace."""
    chunk = {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"content": "Hi"}}]}
    split = json.dumps(chunk, indent=1).split("\n")
    stream = [
        ": a comment the server sends to keep the connection open\n",
        "event: message\nid: 1\n",
        *(f"data: {line}\n" for line in split),
        "\n",
        "data: " + FINISH.removeprefix("data: ").replace("\r\n\r\n", "\n\n"),
        "data: [DONE]\n\n",
    ]
    server = ScriptedServer(events(*stream, chunk=5))
    forwarded, data = await streamed_through(server, client_kind)
    assert [p["content"] for p in forwarded] == ["Hi"]
    assert data["choices"][0]["message"]["content"] == "Hi"


async def test_a_stream_cut_off_after_text_is_not_tried_again(client_kind):
    first = delta("partial answer ")
    script = events(first, delta("and more"), FINISH, fail_after=len(first.encode()) + 10)
    server = ScriptedServer(script, answer("a second try"))
    forwarded: list[dict[str, str]] = []

    async def forward(part: StreamPiece) -> None:
        forwarded.append(part.delta)

    with serving(server) as url:
        upstream = upstream_at(url, client_kind)
        tally = CallTally()
        with pytest.raises(UpstreamError) as failed:
            await upstream.complete(BODY, auth=None, tally=tally, forward=forward)
        await upstream.aclose()
    assert failed.value.status == 502 and not failed.value.retry
    assert forwarded  # the agent already has text: a second try would repeat it
    assert (tally.calls, len(server.requests)) == (1, 1)


async def test_the_upstream_cannot_plant_cookies_shared_by_every_tenant():
    def with_cookie(request: Request) -> Response:
        response = JSONResponse(completion("ok"))
        response.set_cookie("tenant", "first-caller")
        return response

    server = ScriptedServer(with_cookie, answer("second"))
    with serving(server) as url:
        upstream = upstream_at(url, "aiohttp")
        await upstream.complete(BODY, auth=None, tally=CallTally())
        await upstream.complete(BODY, auth=None, tally=CallTally())
        await upstream.aclose()
    assert "cookie" not in server.requests[1]


async def test_one_client_serves_calls_from_a_new_event_loop():
    server = ScriptedServer(answer("ok"))
    with serving(server) as url:
        upstream = upstream_at(url, "aiohttp")
        first = (await upstream.complete(BODY, auth=None, tally=CallTally())).data

        def in_another_loop() -> dict[str, Any]:
            return asyncio.run(upstream.complete(BODY, auth=None, tally=CallTally())).data

        second = await asyncio.to_thread(in_another_loop)
        await upstream.aclose()
    assert first["choices"][0]["message"]["content"] == second["choices"][0]["message"]["content"]


def test_the_environments_proxy_is_used_except_where_no_proxy_says(monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    assert env_proxy("http://model.example:8000/v1") == "http://proxy.example:3128"
    assert env_proxy("http://127.0.0.1:8000/v1") is None
    monkeypatch.delenv("HTTP_PROXY")
    assert env_proxy("http://model.example:8000/v1") is None


@given(
    lines=st.lists(st.text(alphabet="ab \u00e4:", max_size=12), min_size=1, max_size=8),
    ending=st.sampled_from(["\n", "\r\n", "\r"]),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=6),
)
def test_lines_come_out_the_same_however_the_bytes_are_cut(lines, ending, cuts):
    data = "".join(line + ending for line in lines).encode()
    pending, found = b"", []
    bounds = sorted({min(c, len(data)) for c in cuts})
    for start, end in zip([0, *bounds], [*bounds, len(data)], strict=True):
        more, pending = split_lines(pending, data[start:end])
        found += more
    more, pending = split_lines(pending, b"\n" if pending.endswith(b"\r") else b"")
    found += more
    assert [f.decode() for f in found] == lines
    assert pending == b""
