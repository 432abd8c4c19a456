"""The agent's routes read the body from the server's messages and write JSON answers straight,
byte for byte as Starlette's ``Request.stream`` and ``Response`` did: a body in many pieces is
read whole, a client that hangs up mid-body ends the request as before (Starlette's 500 to a
client no longer there, the error raised to the server, nothing stored), an oversized or broken
body is refused, and every JSON answer carries the same status, headers and bytes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
import pytest
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Message

from keeper_middleware.integrations.proxy.conversation.form import RequestError
from keeper_middleware.integrations.proxy.doors.dispatch import read_json
from keeper_middleware.integrations.proxy.doors.errors import JsonReply
from tests.proxy_upstream import (
    ScriptedUpstream,
    chat,
    convo,
    make_app,
    upstream_fixture,  # noqa: F401
)

pytestmark = pytest.mark.anyio
BODY = orjson.dumps(chat(convo("What is the plan?"))) + b"  "


def _scope(headers: Mapping[str, str], method: str = "POST") -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "server": ("127.0.0.1", 1),
        "client": ("127.0.0.1", 2),
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
    }


def _arriving(*messages: Message) -> Any:
    queue = list(messages)

    async def receive() -> Message:
        return queue.pop(0) if queue else {"type": "http.disconnect"}

    return receive


def _pieces(body: bytes, size: int) -> list[Message]:
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    return [
        {"type": "http.request", "body": part, "more_body": i < len(parts) - 1}
        for i, part in enumerate(parts)
    ]


async def _read(messages: list[Message], limit: int = 1 << 20, **headers: str) -> object:
    return await read_json(Request(_scope(headers), _arriving(*messages)), limit)


@pytest.mark.parametrize("size", [len(BODY), 7, 1])
async def test_a_body_in_pieces_is_read_whole(size: int) -> None:
    pieces = _pieces(BODY, size)
    pieces.insert(1, {"type": "http.request", "body": b"", "more_body": True})  # an empty one
    assert await _read(pieces) == orjson.loads(BODY)


async def test_a_client_that_hangs_up_mid_body_raises_client_disconnect() -> None:
    with pytest.raises(ClientDisconnect):
        await _read(_pieces(BODY, 10)[:2])


@pytest.mark.parametrize(("declared", "pieces"), [("999", [BODY]), ("", [BODY[:60], BODY[60:]])])
async def test_an_oversized_body_is_a_413_declared_or_not(
    declared: str, pieces: list[bytes]
) -> None:
    messages: list[Message] = [
        {"type": "http.request", "body": p, "more_body": p is not pieces[-1]} for p in pieces
    ]
    headers = {"content-length": declared} if declared else {}
    with pytest.raises(RequestError) as caught:
        await _read(messages, 80, **headers)
    assert caught.value.status == 413 and "larger than 80 bytes" in caught.value.message


async def test_a_broken_body_names_the_json_error() -> None:
    with pytest.raises(RequestError, match="not valid JSON: unexpected") as caught:
        await _read(_pieces(b'{"messages": [', 4))
    assert caught.value.status == 400


@pytest.mark.parametrize(
    ("body", "status", "headers"),
    [
        ({"a": [1, "é"]}, 200, None),
        ({"error": {"message": "no"}}, 400, {"X-Keeper-Session": "s-1"}),
        ({"error": {}}, 429, {"retry-after": "3"}),
        ({}, 200, {}),
        ({"a": 1}, 200, {"Content-Type": "application/x+json"}),  # Starlette's own rules
        (None, 204, None),
    ],
)
def test_a_json_reply_is_starlettes_response_byte_for_byte(
    body: Any, status: int, headers: dict[str, str] | None
) -> None:
    ours = JsonReply(body, status, headers)
    theirs = Response(orjson.dumps(body), status, headers, media_type="application/json")
    assert (ours.status_code, ours.raw_headers, ours.body, ours.background) == (
        theirs.status_code,
        theirs.raw_headers,
        theirs.body,
        theirs.background,
    )


async def test_a_hang_up_mid_body_on_the_chat_route_stores_nothing(
    upstream: ScriptedUpstream, tmp_path: Any
) -> None:
    app = make_app(upstream, tmp_path)
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    scope = _scope({"content-type": "application/json", "x-keeper-session": "gone"})
    with pytest.raises(ClientDisconnect):
        await app(scope, _arriving(*_pieces(BODY, 10)[:3]), send)
    assert [m.get("status") for m in sent if m["type"] == "http.response.start"] == [500]
    assert b"".join(m.get("body", b"") for m in sent) == b"Internal Server Error"
    assert upstream.requests == [] and app.state.proxy.sessions() == []
    await app.state.proxy.aclose()


@pytest.mark.parametrize("method", ["GET", "HEAD", "PUT"])
async def test_other_methods_on_the_chat_route_are_told_it_is_not_served(
    upstream: ScriptedUpstream, tmp_path: Any, method: str
) -> None:
    app = make_app(upstream, tmp_path)
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    await app(_scope({}, method), _arriving(), send)
    start = sent[0]
    assert start["status"] == 405
    body = b"".join(m.get("body", b"") for m in sent[1:])
    if method != "HEAD":
        message = orjson.loads(body)["error"]["message"]
        assert message == f"{method} /v1/chat/completions is not served here."
    assert upstream.requests == []
    await app.state.proxy.aclose()
