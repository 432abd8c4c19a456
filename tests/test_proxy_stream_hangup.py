"""A streaming agent that hangs up mid-answer: the proxy stops writing at once (no more events,
no end of the body), the server's call returns normally, and the turn still finishes upstream and
is kept. The events written before it are the API's own, with the session's headers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from starlette.types import Message

from tests.proxy_upstream import (
    ScriptedUpstream,
    as_sse,
    chat,
    convo,
    make_app,
    text_reply,
    upstream_fixture,  # noqa: F401
)

pytestmark = pytest.mark.anyio


class _Held(httpx.AsyncByteStream):
    """The upstream's stream: its first two events (the role, then the first text), then the
    rest once ``go`` is set."""

    def __init__(self, data: bytes, go: asyncio.Event) -> None:
        cut = data.index(b"\n\n", data.index(b"\n\n") + 2) + 2
        self.first, self.rest, self.go = data[:cut], data[cut:], go

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.first
        await self.go.wait()
        yield self.rest


def _scope(spec: str | None) -> dict[str, Any]:
    asgi = {"version": "3.0"} if spec is None else {"version": "3.0", "spec_version": spec}
    headers = [(b"content-type", b"application/json"), (b"x-keeper-session", b"gone")]
    return {"type": "http", "asgi": asgi, "http_version": "1.1", "method": "POST",
            "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
            "query_string": b"", "root_path": "", "server": ("127.0.0.1", 1),
            "client": ("127.0.0.1", 2), "headers": headers}  # fmt: skip


@pytest.mark.parametrize("spec", [None, "2.3"])
async def test_a_hang_up_mid_stream_stops_the_writing_and_the_turn_is_kept(
    upstream: ScriptedUpstream, tmp_path: Any, spec: str | None
) -> None:
    go, first_event = asyncio.Event(), asyncio.Event()
    reply = as_sse(text_reply("The plan is to read every chapter twice."))
    upstream.script.append(
        httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=_Held(reply, go))
    )
    app = make_app(upstream, tmp_path)
    body = orjson.dumps(chat(convo("What is the plan?"), stream=True))
    arrived = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[Message] = []

    async def receive() -> Message:
        if arrived:
            return arrived.pop(0)
        await first_event.wait()  # the client hangs up once it has an event
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and message.get("body"):
            first_event.set()

    await asyncio.wait_for(app(_scope(spec), receive, send), 10)
    start, *events = sent
    assert start["status"] == 200
    assert (b"content-type", b"text/event-stream; charset=utf-8") in start["headers"]
    assert (b"x-keeper-session", b"gone") in start["headers"]
    assert events and all(m.get("more_body") for m in events)  # cut: no end of the body
    assert b"".join(m["body"] for m in events).startswith(b'data: {"id":')

    go.set()  # the upstream goes on: the turn is finished and kept all the same
    proxy = app.state.proxy
    for _ in range(3000):  # up to 30 s on a loaded machine
        if proxy.stats("default:gone").requests:
            break
        await asyncio.sleep(0.01)
    assert proxy.stats("default:gone").requests == 1
    kept = proxy.record("default:gone").window
    assert kept[-1].content == "The plan is to read every chapter twice."
    await proxy.aclose()
