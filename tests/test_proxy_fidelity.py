"""The proxy is invisible to its clients, as the official ``openai`` SDK sees it: note calls carry
only the model, messages, tools and the keeper's own settings; a stream keeps the upstream's id,
model and system fingerprint from its first chunk and passes log probabilities on (plain replies
too); a stream the upstream cut short is an error, never a finished reply, and is not kept; a
refused request is a 4xx naming the field and stores nothing; an unknown route needs the key
first; a slow client's headers have a deadline; a long ``Retry-After`` goes back at once and no
wait counts as time the proxy added; search results are never found again by a search."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import openai
import pytest

from keeper_middleware.integrations.proxy import RetryPolicy, create_proxy_app
from keeper_middleware.integrations.proxy.cli import serve_in_thread
from tests.proxy_upstream import (
    AGENT_TOOL,
    SYSTEM,
    ScriptedUpstream,
    make_app,
    story,
    text_reply,
    tool_reply,
)

pytestmark = pytest.mark.anyio

SESSION = {"X-Keeper-Session": "s"}


@contextmanager
def sdk_for(app: Any, **options: Any) -> Iterator[openai.AsyncOpenAI]:
    """The official client, in-process against the app (no socket)."""
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy.test")
    options.setdefault("api_key", "unused")
    yield openai.AsyncOpenAI(
        base_url="http://proxy.test/v1", http_client=http, max_retries=0, **options
    )


def sse(*events: dict[str, Any], done: bool = True) -> httpx.Response:
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events)
    body += "data: [DONE]\n\n" if done else ""
    return httpx.Response(200, content=body.encode(), headers={"content-type": "text/event-stream"})


ENVELOPE = {"id": "chatcmpl-up42", "created": 7, "model": "up-model", "system_fingerprint": "fp_9"}


def logprob(token: str) -> dict[str, Any]:
    return {"token": token, "logprob": -0.5, "bytes": list(token.encode()), "top_logprobs": []}


def chunk(delta: dict[str, Any], reason: str | None = None, logprobs: Any = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": reason, "logprobs": logprobs}
    return {**ENVELOPE, "object": "chat.completion.chunk", "choices": [choice]}


def text_chunks(*pieces: str) -> list[dict[str, Any]]:
    return [chunk({"content": p}, logprobs={"content": [logprob(p)]}) for p in pieces]


def first_messages() -> list[Any]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Task: keep notes."}]


# ----------------------------------------------------------------------------- note calls


async def test_note_calls_carry_only_the_model_the_prefix_and_the_keepers_settings(tmp_path):
    upstream = ScriptedUpstream()
    app = make_app(upstream, tmp_path, window=2048, reasoning_effort="medium")
    agents_fields = {
        "stop": ["\n"],
        "max_tokens": 12,
        "temperature": 0.1,
        "top_p": 0.5,
        "logprobs": True,
        "top_logprobs": 2,
        "seed": 3,
        "presence_penalty": 1.0,
        "response_format": {"type": "text"},
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "metadata": {"run": "x"},
        "user": "u1",
    }
    history = first_messages()
    with sdk_for(app) as client:
        for i in range(1, 14):
            history.append({"role": "user", "content": story(i)})
            reply = await client.chat.completions.create(
                model="agent-model",
                messages=history,
                tools=[AGENT_TOOL],
                extra_headers=SESSION,
                **agents_fields,
            )
            history.append({"role": "assistant", "content": reply.choices[0].message.content})
    await app.state.proxy.aclose()
    assert upstream.note_calls, "the session never cut"
    for work in upstream.work_calls:  # the agent's own calls keep every field it sent
        assert work["stop"] == ["\n"] and work["logprobs"] is True and work["seed"] == 3
    for note in upstream.note_calls:
        allowed = {"model", "messages", "tools", "stream", "reasoning_effort", "max_tokens"}
        assert set(note) <= allowed
        assert note["model"] == "agent-model" and note["reasoning_effort"] == "medium"
        assert note["max_tokens"] == app.state.proxy.keeper.config.reserve  # not the agent's 12
        work = next(w for w in reversed(upstream.requests) if w is not note and not is_note(w))
        assert note["tools"] == work["tools"]  # the prefix is rendered as in a work call
        assert note["messages"][0] == work["messages"][0]


def is_note(body: dict[str, Any]) -> bool:
    last = body["messages"][-1].get("content") or ""
    return isinstance(last, str) and last.startswith(("[NOTES REQUEST]", "[NOTES CHECK]"))


# ----------------------------------------------------------------------------- envelopes


async def test_a_stream_keeps_the_upstreams_envelope_and_log_probabilities(tmp_path):
    pieces = ["The ", "ledger ", "balances."]
    upstream = ScriptedUpstream(
        script=[
            sse(
                chunk({"role": "assistant", "content": ""}),
                *text_chunks(*pieces),
                chunk({}, "stop"),
            )
        ]
    )
    app = make_app(upstream, tmp_path)
    with sdk_for(app) as client:
        stream = await client.chat.completions.create(
            model="m", messages=first_messages(), stream=True, logprobs=True, extra_headers=SESSION
        )
        chunks = [c async for c in stream]
    await app.state.proxy.aclose()
    assert {(c.id, c.model, c.system_fingerprint, c.created) for c in chunks} == {
        ("chatcmpl-up42", "up-model", "fp_9", 7)
    }
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    tokens = [
        entry.token
        for c in chunks
        if c.choices and c.choices[0].logprobs and c.choices[0].logprobs.content
        for entry in c.choices[0].logprobs.content
    ]
    assert text == "".join(pieces) and tokens == pieces
    assert chunks[-1].choices[0].finish_reason == "stop"


async def test_log_probabilities_held_back_behind_a_tool_call_come_with_the_rest(tmp_path):
    call = {"index": 0, "id": "c1", "type": "function", "function": {"name": "read_file"}}
    upstream = ScriptedUpstream(
        script=[
            sse(
                *text_chunks("Reading "),
                chunk({"tool_calls": [call]}),
                chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
                *text_chunks("now."),
                chunk({}, "tool_calls"),
            )
        ]
    )
    app = make_app(upstream, tmp_path)
    with sdk_for(app) as client:
        stream = await client.chat.completions.create(
            model="m",
            messages=first_messages(),
            tools=[AGENT_TOOL],
            stream=True,
            logprobs=True,
            extra_headers=SESSION,
        )
        chunks = [c async for c in stream]
    await app.state.proxy.aclose()
    tokens = [
        entry.token
        for c in chunks
        if c.choices and c.choices[0].logprobs and c.choices[0].logprobs.content
        for entry in c.choices[0].logprobs.content
    ]
    assert tokens == ["Reading ", "now."]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Reading now."


async def test_a_plain_reply_keeps_its_log_probabilities_and_system_fingerprint(tmp_path):
    data = text_reply("Balanced.")
    data["system_fingerprint"] = "fp_9"
    data["choices"][0]["logprobs"] = {"content": [logprob("Balanced.")], "refusal": None}
    upstream = ScriptedUpstream(script=[data])
    app = make_app(upstream, tmp_path)
    with sdk_for(app) as client:
        reply = await client.chat.completions.create(
            model="m", messages=first_messages(), logprobs=True, extra_headers=SESSION
        )
    await app.state.proxy.aclose()
    assert reply.system_fingerprint == "fp_9"
    assert reply.choices[0].logprobs is not None
    assert [e.token for e in reply.choices[0].logprobs.content or []] == ["Balanced."]


# ----------------------------------------------------------------------------- truncation


async def test_a_stream_the_upstream_cut_short_is_an_error_and_is_not_kept(tmp_path):
    upstream = ScriptedUpstream(
        script=[sse(*text_chunks("The balance is ", "forty"), done=False), text_reply("Again.")]
    )
    app = make_app(upstream, tmp_path)
    received: list[Any] = []
    with sdk_for(app) as client:
        stream = await client.chat.completions.create(
            model="m", messages=first_messages(), stream=True, extra_headers=SESSION
        )
        with pytest.raises(openai.APIError, match="ended before the reply was complete"):
            async for piece in stream:
                received.append(piece)
        # the agent tries again with the same history: the cut-short text is nowhere in it
        again = await client.chat.completions.create(
            model="m", messages=first_messages(), extra_headers=SESSION
        )
    proxy = app.state.proxy
    window = proxy.record("default:s").window
    await proxy.aclose()
    assert "".join(c.choices[0].delta.content or "" for c in received if c.choices)
    assert all(c.choices[0].finish_reason is None for c in received if c.choices)
    assert again.choices[0].message.content == "Again."
    assert not any("forty" in str(m.content) for m in window if m.type == "ai")
    assert "forty" not in json.dumps(upstream.requests[-1]["messages"])


# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ({"role": "assistant", "content": None, "tool_calls": "read_file()"}, "tool_calls"),
        ({"role": "assistant", "content": "x", "tool_calls": {"id": "c1"}}, "tool_calls"),
        ({"role": "tool", "content": "x"}, "tool_call_id"),
        ({"role": "user", "content": 5}, "content"),
    ],
)
async def test_a_refused_request_is_a_4xx_naming_the_field_and_stores_nothing(
    tmp_path, message, field
):
    upstream = ScriptedUpstream()
    app = make_app(upstream, tmp_path)
    with sdk_for(app) as client, pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(
            model="m", messages=[*first_messages(), message], extra_headers=SESSION
        )
    proxy = app.state.proxy
    sessions = proxy.sessions()
    await proxy.aclose()
    error = refused.value.body
    assert isinstance(error, dict) and error["param"] == f"messages[2].{field}"
    assert field in error["message"]
    assert sessions == [] and upstream.requests == []


async def test_a_request_the_upstream_refuses_stores_nothing_either(tmp_path):
    rejection = httpx.Response(400, json={"error": {"message": "temperature must be <= 2"}})
    upstream = ScriptedUpstream(script=[rejection])
    app = make_app(upstream, tmp_path)
    with sdk_for(app) as client, pytest.raises(openai.BadRequestError, match="temperature"):
        await client.chat.completions.create(
            model="m", messages=first_messages(), temperature=9, extra_headers=SESSION
        )
    sessions = app.state.proxy.sessions()
    await app.state.proxy.aclose()
    assert sessions == []


async def test_unknown_routes_need_the_key_before_they_are_named(tmp_path):
    app = make_app(ScriptedUpstream(), tmp_path, api_key="sekrit")
    with sdk_for(app, api_key="wrong") as stranger, sdk_for(app, api_key="sekrit") as owner:
        for path in ("/nothing", "/admin/config"):
            with pytest.raises(openai.AuthenticationError):
                await stranger.get(path, cast_to=object)
            with pytest.raises(openai.NotFoundError):
                await owner.get(path, cast_to=object)
        with pytest.raises(openai.AuthenticationError):  # a wrong method on a real route too
            await stranger.delete("/chat/completions", cast_to=object)
    await app.state.proxy.aclose()


# ----------------------------------------------------------------------------- slow clients


def test_connections_that_send_headers_slowly_are_closed(tmp_path):
    upstream = ScriptedUpstream()
    app = create_proxy_app(
        "http://upstream.test/v1",
        window=32_768,
        archive_dir=tmp_path,
        transport=upstream.transport(),
    )
    with serve_in_thread(app, header_timeout=0.5) as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
        request = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: app"
        started = time.monotonic()
        closed: set[int] = set()
        for position in range(len(request)):  # one byte a tenth of a second, each connection
            for number, sock in enumerate(slow):
                if number not in closed:
                    try:
                        sock.sendall(request[position : position + 1])
                    except OSError:
                        closed.add(number)
            if len(closed) == len(slow) or time.monotonic() - started > 5:
                break
            time.sleep(0.1)
        for number, sock in enumerate(slow):
            sock.settimeout(2)
            try:
                if sock.recv(100) == b"":
                    closed.add(number)
            except (ConnectionResetError, BrokenPipeError):
                closed.add(number)
            except TimeoutError:
                pass
            sock.close()
        elapsed = time.monotonic() - started
        # a client that sends its request at once is served on the same server
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=10)
        reply = client.chat.completions.create(model="m", messages=first_messages())
    assert closed == set(range(len(slow))) and elapsed < 4.5
    assert reply.choices[0].message.content


# ----------------------------------------------------------------------------- Retry-After


async def test_a_retry_after_past_the_cap_goes_back_to_the_agent_at_once(tmp_path):
    overloaded = httpx.Response(429, headers={"retry-after": "30"}, json={})
    upstream = ScriptedUpstream(script=[overloaded])
    policy = RetryPolicy(attempts=4, first_wait=0.0, max_wait=0.0, budget=120.0, timeout=5.0)
    app = make_app(upstream, tmp_path, retry=policy)
    started = time.monotonic()
    with sdk_for(app) as client, pytest.raises(openai.RateLimitError) as limited:
        await client.chat.completions.create(
            model="m", messages=first_messages(), extra_headers=SESSION
        )
    elapsed = time.monotonic() - started
    await app.state.proxy.aclose()
    assert elapsed < 5 and len(upstream.requests) == 1
    assert limited.value.response.headers["retry-after"] == "30"


async def test_waiting_as_the_upstream_asked_is_not_time_the_proxy_added(tmp_path):
    busy = httpx.Response(503, headers={"retry-after": "1"}, json={})
    upstream = ScriptedUpstream(script=[busy, text_reply("Served.")])
    policy = RetryPolicy(attempts=3, first_wait=0.0, max_wait=0.0, budget=30.0, timeout=5.0)
    app = make_app(upstream, tmp_path, retry=policy)
    with sdk_for(app) as client:
        reply = await client.chat.completions.create(
            model="m", messages=first_messages(), extra_headers=SESSION
        )
    stats = app.state.proxy.stats("default:s")
    await app.state.proxy.aclose()
    assert reply.choices[0].message.content == "Served."
    assert stats.backoff_seconds >= 0.9
    assert stats.added_seconds < 0.5  # the second's wait is the upstream's, not the proxy's


# ----------------------------------------------------------------------------- search results


@pytest.mark.parametrize("streaming", [False, True])
async def test_search_results_are_never_found_again_by_a_search(tmp_path, streaming):
    upstream = ScriptedUpstream()
    app = make_app(upstream, tmp_path, window=2048)
    history = first_messages()

    async def ask(client: openai.AsyncOpenAI, text: str) -> None:
        history.append({"role": "user", "content": text})
        if streaming:
            stream = await client.chat.completions.create(
                model="m", messages=history, stream=True, extra_headers=SESSION
            )
            content = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        else:
            reply = await client.chat.completions.create(
                model="m", messages=history, extra_headers=SESSION
            )
            content = reply.choices[0].message.content or ""
        history.append({"role": "assistant", "content": content})

    with sdk_for(app) as client:
        for i in range(1, 13):
            await ask(client, story(i))
        for round_ in range(3):  # each search quotes domo2's turn; the answers do not
            upstream.script = [
                tool_reply((f"s{round_}", "search_archive", {"query": "domo2"})),
                text_reply(f"Answer {round_}."),
            ]
            await ask(client, f"What was the second item, round {round_}?")
            for i in range(13 + 8 * round_, 21 + 8 * round_):  # the results leave the window
                await ask(client, story(i))
    keeper = app.state.proxy.keeper
    found = keeper.run_search_tool("default:s", {"query": "domo2 clerk recorded"})
    archived = [t for t in keeper.archive.turns("default:s") if t.name == "search_archive"]
    await app.state.proxy.aclose()
    assert archived, "the search results never left the window"
    quoted = [line for line in found.splitlines() if line.startswith("item ")]
    # every match is a turn of the conversation, never a search result quoting one
    assert quoted and not any("Found " in line or "matches for" in line for line in quoted)
    # domo2's turn is found where it was said (the user's item 2, or the reply quoting it),
    # never at the items where a search quoted it
    assert any("recorded domo2" in line for line in quoted)
    assert all(line.startswith("item 2: ") for line in quoted if "domo2" in line)
