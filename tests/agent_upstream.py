"""A scripted model server that real agent clients talk to: Chat Completions, Responses and
Anthropic Messages on one Starlette app, streamed and not, playing a ``CodingSession``.

``AgentUpstream`` records every request (route, headers, body) so a test can assert what a client
sent; answers the keeper's note requests (any API) with ``notes_reply``; answers
``/v1/messages/count_tokens`` and ``/v1/models``; and answers a request the script cannot place
with a 400 that says why, so a client's failure names its cause.

``OutsideTrafficSentinel`` is the address a client under test gets as its HTTP(S) proxy: every
connection a client tries to make beyond 127.0.0.1 arrives there, is refused and recorded, so a
test can assert that a session used the loopback only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from keeper_middleware.integrations.proxy.cli import serve_in_thread
from tests import api_wire
from tests.coding_session import CodingSession, Reply, ScriptError, ToolResult, Turn, next_reply

API_READERS: dict[str, Callable[[dict[str, Any]], Turn]] = {
    "chat": api_wire.read_chat,
    "responses": api_wire.read_responses,
    "messages": api_wire.read_messages,
}


@dataclass(frozen=True)
class Recorded:
    api: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class AgentUpstream:
    """The scripted upstream; ``requests`` holds every request it was sent, in order."""

    session: CodingSession
    notes_reply: Callable[[Turn], str] = lambda turn: "NO CHANGES"
    requests: list[Recorded] = field(default_factory=list)
    serial: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reply_to(self, api: str, body: dict[str, Any]) -> Reply:
        turn = API_READERS[api](body)
        if turn.is_note_call():
            return Reply(text=self.notes_reply(turn))
        return next_reply(self.session, turn)

    def calls(self, api: str | None = None) -> list[Recorded]:
        return [r for r in self.requests if api is None or r.api == api]

    def tool_results(self, api: str) -> dict[str, str]:
        """Every tool result that reached the model, by call id (the last text for each id)."""
        found: dict[str, str] = {}
        for recorded in self.calls(api):
            for item in API_READERS[api](recorded.body).items:
                if isinstance(item, ToolResult):
                    found[item.call_id] = item.text
        return found

    # ------------------------------------------------------------------------- the app

    def app(self) -> Starlette:
        async def models(request: Request) -> Response:
            return JSONResponse(
                {"object": "list", "data": [{"id": api_wire.MODEL, "object": "model"}]}
            )

        async def count_tokens(request: Request) -> Response:
            body = await request.json()
            self.record("count_tokens", request, body)
            return JSONResponse({"input_tokens": api_wire.usage_tokens(body)})

        def route(api: str) -> Callable[[Request], Any]:
            async def answer(request: Request) -> Response:
                body = await request.json()
                serial = self.record(api, request, body)
                try:
                    reply = self.reply_to(api, body)
                except ScriptError as exc:
                    return error(api, str(exc))
                return render(api, reply, body, serial)

            return answer

        return Starlette(
            routes=[
                Route("/v1/models", models),
                Route("/v1/chat/completions", route("chat"), methods=["POST"]),
                Route("/v1/responses", route("responses"), methods=["POST"]),
                Route("/v1/messages", route("messages"), methods=["POST"]),
                Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
            ]
        )

    def record(self, api: str, request: Request, body: dict[str, Any]) -> int:
        with self.lock:
            self.serial += 1
            self.requests.append(Recorded(api, request.url.path, dict(request.headers), body))
            return self.serial

    @contextmanager
    def serving(self) -> Iterator[str]:
        """Serve on 127.0.0.1; yields the ``/v1`` base URL."""
        with serve_in_thread(self.app()) as url:
            yield url


RENDER_EVENTS = {
    "chat": api_wire.chat_events,
    "responses": api_wire.responses_events,
    "messages": api_wire.messages_events,
}
RENDER_BODY = {
    "chat": api_wire.chat_body,
    "responses": api_wire.responses_body,
    "messages": api_wire.messages_body,
}


def render(api: str, reply: Reply, body: dict[str, Any], serial: int) -> Response:
    if body.get("stream"):
        events = RENDER_EVENTS[api](reply, body, serial)
        return StreamingResponse(
            api_wire.sse(events, done=api == "chat"), media_type="text/event-stream"
        )
    return JSONResponse(RENDER_BODY[api](reply, body, serial))


def error(api: str, message: str) -> Response:
    if api == "messages":
        envelope: dict[str, Any] = {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": message},
        }
    else:
        envelope = {"error": {"message": message, "type": "invalid_request_error", "code": None}}
    return JSONResponse(envelope, status_code=400)


# ----------------------------------------------------------------------------- outside traffic


class OutsideTrafficSentinel:
    """An HTTP proxy on 127.0.0.1 that refuses everything and records where it was asked to go."""

    def __init__(self) -> None:
        self.attempts: list[str] = []
        sentinel = self

        class Refuse(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def refuse(self) -> None:
                sentinel.attempts.append(f"{self.command} {self.path}")
                self.send_response(403, "no network in tests")
                self.send_header("content-length", "0")
                self.send_header("connection", "close")
                self.end_headers()
                self.close_connection = True

        for verb in ("CONNECT", "GET", "POST", "HEAD", "PUT"):
            setattr(Refuse, f"do_{verb}", Refuse.refuse)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> OutsideTrafficSentinel:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def environment(self) -> dict[str, str]:
        """Proxy variables (both spellings) sending all but the loopback to the sentinel."""
        names = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
        env = {name: self.url for name in names} | {name.lower(): self.url for name in names}
        loopback = "127.0.0.1,localhost,::1"
        return env | {"NO_PROXY": loopback, "no_proxy": loopback}
