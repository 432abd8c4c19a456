"""The Responses and Messages front doors: ``POST /v1/responses`` and ``POST /v1/messages``.

Both lead to the same keeper, tenants, sessions, quotas, metrics and archive as
``/v1/chat/completions``: the request is read into the internal model
(:mod:`.responses_format`, :mod:`.messages_format`), the engine answers it, and the answer goes
back as the API's own JSON or server-sent events (:mod:`.front_streams`), with errors in the API's
own shape. Keys are read from ``Authorization: Bearer`` and, for Messages, ``x-api-key``.

A session is named, within the caller's tenant, by the first of: ``X-Keeper-Session``; the
client's own conversation header (Codex's ``session-id``, Claude Code's
``X-Claude-Code-Session-Id``); Responses' ``prompt_cache_key``; the session id Claude Code puts in
``metadata.user_id``; else a hash of the end user, the system prompt and the first user message
(:func:`~.tenants.fallback_session`). Responses' ``previous_response_id`` names the session
that gave that response; the proxy's response ids say which (they hold no secret: the session
is looked up in the caller's own tenant only).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from keeper_middleware.errors import WindowTooSmallError
from keeper_middleware.integrations.proxy.api_params import claude_session_of, user_of
from keeper_middleware.integrations.proxy.engine import Answer, KeeperProxy, QuotaError
from keeper_middleware.integrations.proxy.front_streams import MessagesWriter, ResponsesWriter
from keeper_middleware.integrations.proxy.messages_format import (
    message_blocks,
    messages_usage,
    parse_messages_request,
    stop_reason,
)
from keeper_middleware.integrations.proxy.openai_format import (
    WIRE_KEY,
    ChatRequest,
    RequestError,
)
from keeper_middleware.integrations.proxy.responses_format import (
    parse_responses_request,
    response_output,
    responses_usage,
)
from keeper_middleware.integrations.proxy.streaming import StreamPiece
from keeper_middleware.integrations.proxy.tenants import (
    SESSION_HEADER,
    Caller,
    SessionIdError,
    Tenants,
    check_name,
    fallback_session,
    stored_name,
)
from keeper_middleware.integrations.proxy.upstream import (
    RetryPolicy,
    UpstreamError,
    retry_after_header,
)
from keeper_middleware.integrations.proxy.wire import ToolNames, item_id

__all__ = ["FrontDoors", "front_session", "parse_response_id", "response_id"]

_log = logging.getLogger(__name__)
_RUNNING: set[asyncio.Task[None]] = set()
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
CLIENT_SESSION_HEADERS = {
    "responses": (("session-id", "codex"),),
    "messages": (("x-claude-code-session-id", "claude"),),
}
"""The conversation headers of the clients people run, and the prefix their sessions get."""
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                    403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                    429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}  # fmt: skip


# ---------------------------------------------------------------------------- naming


def _safe(prefix: str, value: str) -> str:
    name = f"{prefix}-{value}"
    if _NAME.fullmatch(name):
        return name
    return f"{prefix}-{hashlib.sha256(value.encode()).hexdigest()[:32]}"


def front_session(
    headers: Mapping[str, str], request: ChatRequest, *, require: bool = False
) -> str:
    """The session a Responses or Messages request belongs to, within its tenant (see the
    module). ``require`` refuses a request that names none (the fallback hash)."""
    given = headers.get(SESSION_HEADER)
    if given is not None:
        return check_name(given, SESSION_HEADER)
    for header, prefix in CLIENT_SESSION_HEADERS.get(request.api, ()):
        if headers.get(header):
            return _safe(prefix, headers[header])
    cache_key = request.params.get("prompt_cache_key") if request.api == "responses" else None
    if isinstance(cache_key, str) and cache_key:
        return _safe("pck", cache_key)
    claude = claude_session_of(request.params) if request.api == "messages" else None
    if claude:
        return _safe("claude", claude)
    user = user_of(request.params, request.api)
    if require and not user:
        raise SessionIdError(
            f"this proxy serves several users per key: send an {SESSION_HEADER} header, a "
            "conversation header of your client, or name the end user"
        )
    return fallback_session(request.system_prompt, request.messages, user)


def response_id(session: str, *, stored: bool) -> tuple[str, str]:
    """A new Responses answer's id, and the id its reply gets in the session. The response id
    says which session (within the caller's tenant), which reply, and whether it may be
    continued (``store``)."""
    nonce = f"{random.getrandbits(64):016x}"
    flag = "k" if stored else "x"
    return f"resp_{flag}{session.encode().hex()}.{nonce}", f"r-{nonce}"


def parse_response_id(value: str) -> tuple[str, str]:
    """(session, the reply's id in it) of a :func:`response_id` that may be continued."""
    refused = RequestError(
        f"Response {value[:80]!r} is not known to this proxy: send the whole conversation in "
        "'input', or continue from the latest response of the conversation.",
        param="previous_response_id",
    )
    head, _, nonce = value.partition(".")
    if not head.startswith("resp_") or len(head) < 7 or not nonce.isalnum():
        raise refused
    try:
        session = bytes.fromhex(head[6:]).decode()
    except (ValueError, UnicodeDecodeError):
        raise refused from None
    if not _NAME.fullmatch(session) or head[5] not in "kx":
        raise refused
    if head[5] == "x":
        raise RequestError(
            f"Response {value[:80]!r} was created with store=false, so it cannot be continued; "
            "send the whole conversation in 'input', or leave store on.",
            param="previous_response_id",
        )
    return session, f"r-{nonce}"


def _compacted(headers: Mapping[str, str]) -> bool:
    """Whether Codex says this request follows one of its own compactions (its window number,
    the part after the colon of ``x-codex-window-id``, is past 0)."""
    window = headers.get("x-codex-window-id") or ""
    number = window.rpartition(":")[2]
    return number.isdigit() and int(number) > 0


# ---------------------------------------------------------------------------- errors


@dataclass(frozen=True, slots=True)
class Failure:
    status: int
    message: str
    kind: str
    code: str | None = None
    param: str | None = None
    headers: Mapping[str, str] | None = None

    def openai(self) -> Response:
        body = {"error": {"message": self.message, "type": self.kind, "code": self.code,
                          "param": self.param}}  # fmt: skip
        return _json(body, self.status, self.headers)

    def anthropic_error(self) -> dict[str, Any]:
        kind = _ANTHROPIC_TYPES.get(self.status, "api_error")
        return {"type": kind, "message": self.message}

    def anthropic(self) -> Response:
        return _json({"type": "error", "error": self.anthropic_error()}, self.status, self.headers)


def _json(body: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    import orjson

    return Response(orjson.dumps(body), status, dict(headers or {}), media_type="application/json")


def failure_of(exc: BaseException, session: str, retry: RetryPolicy) -> Failure:
    """What the client is told of a request that failed (the chat door's statuses)."""
    if isinstance(exc, UpstreamError):
        return Failure(exc.status, exc.message, "upstream_error", exc.code,
                       headers=retry_after_header(exc, retry))  # fmt: skip
    if isinstance(exc, RequestError):
        code = "previous_response_not_found" if exc.param == "previous_response_id" else None
        return Failure(exc.status, exc.message, "invalid_request_error", code, exc.param)
    if isinstance(exc, SessionIdError):
        return Failure(400, str(exc), "invalid_request_error", "invalid_session")
    if isinstance(exc, WindowTooSmallError):
        return Failure(400, str(exc), "invalid_request_error", "context_length_exceeded")
    if isinstance(exc, QuotaError):
        return Failure(413, str(exc), "invalid_request_error", "quota_exceeded")
    _log.exception("keeper proxy failed on session %s", session, exc_info=exc)
    return Failure(500, f"The keeper proxy failed: {exc!r}", "server_error")


# ---------------------------------------------------------------------------- the doors


@dataclass
class FrontDoors:
    """The two front doors over one :class:`KeeperProxy` (``create_proxy_app`` builds them)."""

    proxy: KeeperProxy
    callers: Tenants
    retry: RetryPolicy
    read_json: Callable[[Request], Awaitable[object]]
    require_session: bool = False

    def routes(self) -> list[Route]:
        return [
            Route("/v1/responses", self.responses, methods=["POST"]),
            Route("/v1/responses/{rest:path}", self.not_kept, methods=["GET", "DELETE", "POST"]),
            Route("/v1/messages", self.messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"]),
        ]

    def _caller(self, request: Request, anthropic: bool) -> Caller | Failure:
        key = request.headers.get("authorization")
        if key is None and anthropic and request.headers.get("x-api-key"):
            key = f"Bearer {request.headers['x-api-key']}"
        caller = self.callers.identify(key)
        if caller is None:
            how = "'x-api-key: <key>' or " if anthropic else ""
            return Failure(401, f"Missing or wrong API key: send {how}'Authorization: Bearer "
                           "<key>'.", "authentication_error", "invalid_api_key")  # fmt: skip
        if caller.tenant is None:
            return Failure(403, "This key only reads /metrics.", "permission_error")
        return caller

    async def not_kept(self, request: Request) -> Response:
        caller = self._caller(request, False)
        if isinstance(caller, Failure):
            return caller.openai()
        return Failure(
            404,
            "keeper-proxy keeps no responses to retrieve, list or delete: it keeps the "
            "conversation itself (GET /keeper/sessions/<id> shows its notes and counters).",
            "invalid_request_error",
            "not_found",
        ).openai()

    async def responses(self, request: Request) -> Response:
        caller = self._caller(request, False)
        if isinstance(caller, Failure):
            return caller.openai()
        assert caller.tenant is not None
        try:
            parsed = parse_responses_request(await self.read_json(request))
            session, parsed = self._responses_session(request, parsed)
            if parsed.continues is None and _compacted(request.headers):
                parsed = replace(parsed, keep_dropped=True)
        except (RequestError, SessionIdError) as exc:
            return failure_of(exc, "", self.retry).openai()
        name = stored_name(caller.tenant, session)
        auth = request.headers.get("authorization")
        stored = parsed.params.get("store") is not False
        answer_id, reply_id = response_id(session, stored=stored)
        parsed = replace(parsed, reply_id=reply_id)
        door = _ResponsesDoor(parsed, answer_id, stored, int(time.time()))
        return await self._answer(name, session, parsed, auth, door)

    def _responses_session(self, request: Request, parsed: ChatRequest) -> tuple[str, ChatRequest]:
        """The session, and the request marked as a continuation when it names a previous
        response (then it is that response's session, in the caller's tenant)."""
        given = parsed.params.get("previous_response_id")
        if not given:
            return front_session(request.headers, parsed, require=self.require_session), parsed
        session, reply = parse_response_id(str(given))
        named = request.headers.get(SESSION_HEADER)
        if named is not None and named != session:
            raise RequestError(
                f"previous_response_id belongs to another session than {SESSION_HEADER} "
                f"{named[:40]!r}; send one or the other.",
                param="previous_response_id",
            )
        return session, replace(parsed, continues=reply)

    async def messages(self, request: Request) -> Response:
        caller = self._caller(request, True)
        if isinstance(caller, Failure):
            return caller.anthropic()
        assert caller.tenant is not None
        try:
            parsed = parse_messages_request(await self.read_json(request))
            session = front_session(request.headers, parsed, require=self.require_session)
        except (RequestError, SessionIdError) as exc:
            return failure_of(exc, "", self.retry).anthropic()
        if parsed.context is not None and self.proxy.upstream.api.name == "messages":
            passed = {k: request.headers[k] for k in ("anthropic-version", "anthropic-beta")
                      if k in request.headers}  # fmt: skip
            parsed = replace(parsed, context=replace(parsed.context, headers=passed))
        name = stored_name(caller.tenant, session)
        auth = request.headers.get("authorization")
        if auth is None and request.headers.get("x-api-key"):
            auth = f"Bearer {request.headers['x-api-key']}"
        door = _MessagesDoor(parsed, self.proxy.upstream.api.name == "messages")
        return await self._answer(name, session, parsed, auth, door)

    async def count_tokens(self, request: Request) -> Response:
        """Claude Code sizes large tool results with this: the keeper's own count of the
        request as sent (the window it will send is never larger)."""
        caller = self._caller(request, True)
        if isinstance(caller, Failure):
            return caller.anthropic()
        try:
            parsed = parse_messages_request(await self.read_json(request))
        except RequestError as exc:
            return failure_of(exc, "", self.retry).anthropic()
        from langchain_core.messages import SystemMessage

        keeper = self.proxy.keeper
        head = [SystemMessage(content=parsed.system_prompt)] if parsed.system_prompt else []
        count = keeper.tokens.count_messages([*head, *parsed.messages], list(parsed.tools))
        return _json({"input_tokens": count})

    async def _answer(
        self, name: str, session: str, parsed: ChatRequest, auth: str | None, door: _Door
    ) -> Response:
        headers = {SESSION_HEADER: session}
        if parsed.stream:
            return await _stream(self.proxy, name, parsed, auth, headers, door, self.retry)
        try:
            answer = await self.proxy.chat(name, parsed, auth)
        except Exception as exc:
            return door.error(failure_of(exc, name, self.retry))
        return _json(door.body(answer), headers=headers)


class _Door:
    """One API's answer: as one JSON body, or as the writer's events."""

    def body(self, answer: Answer) -> dict[str, Any]:
        raise NotImplementedError

    def error(self, failure: Failure) -> Response:
        raise NotImplementedError

    def start(self, first: StreamPiece | Answer) -> bytes:
        raise NotImplementedError

    def piece(self, piece: StreamPiece) -> bytes:
        raise NotImplementedError

    def finish(self, answer: Answer) -> bytes:
        raise NotImplementedError

    def failed(self, failure: Failure) -> bytes:
        raise NotImplementedError


def _wire(answer: Answer) -> Mapping[str, Any] | None:
    wire = answer.data["choices"][0]["message"].get(WIRE_KEY)
    return wire if isinstance(wire, Mapping) else None


class _ResponsesDoor(_Door):
    def __init__(self, parsed: ChatRequest, answer_id: str, stored: bool, created: int) -> None:
        self.parsed, self.id, self.stored, self.created = parsed, answer_id, stored, created
        context = parsed.context
        self.names = context.names if context is not None else ToolNames()
        self.writer: ResponsesWriter | None = None

    def _envelope(self, answer: Answer | None) -> dict[str, Any]:
        params = self.parsed.params
        context = self.parsed.context
        model = (answer.data.get("model") if answer else None) or params.get("model") or ""
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "model": model,
            "instructions": context.instructions if context is not None else None,
            "tools": list(context.tools) if context is not None else [],
            "tool_choice": params.get("tool_choice", "auto"),
            "parallel_tool_calls": params.get("parallel_tool_calls", True),
            "previous_response_id": params.get("previous_response_id"),
            "store": self.stored,
            "metadata": params.get("metadata") or {},
            "temperature": params.get("temperature"),
            "top_p": params.get("top_p"),
            "reasoning": params.get("reasoning"),
            "text": params.get("text") or {"format": {"type": "text"}},
            "error": None,
            "incomplete_details": None,
        }

    def _finished(self, answer: Answer, output: list[Any]) -> dict[str, Any]:
        wire = _wire(answer)
        native = (wire or {}).get("reply", {}).get("usage") if wire else None
        usage = dict(native) if isinstance(native, Mapping) and wire and wire.get("api") == (
            "responses") else responses_usage(answer.data.get("usage"))  # fmt: skip
        body = {**self._envelope(answer), "status": "completed", "output": output, "usage": usage}
        if answer.reason in ("length", "content_filter"):
            reason = "max_output_tokens" if answer.reason == "length" else "content_filter"
            body |= {"status": "incomplete", "incomplete_details": {"reason": reason}}
        return body

    def body(self, answer: Answer) -> dict[str, Any]:
        output = response_output(answer.message, _wire(answer), self.names)
        return self._finished(answer, output)

    def error(self, failure: Failure) -> Response:
        return failure.openai()

    def start(self, first: StreamPiece | Answer) -> bytes:
        envelope = self._envelope(first if isinstance(first, Answer) else None)
        self.writer = ResponsesWriter(skeleton=envelope)
        return self.writer.start()

    def piece(self, piece: StreamPiece) -> bytes:
        assert self.writer is not None
        return self.writer.piece(piece)

    def finish(self, answer: Answer) -> bytes:
        assert self.writer is not None
        items = response_output(answer.message, _wire(answer), self.names)
        events, output = self.writer.finish(items, answer.call)
        return events + self.writer.completed(self._finished(answer, output))

    def failed(self, failure: Failure) -> bytes:
        assert self.writer is not None
        error = {"code": failure.code or failure.kind, "message": failure.message,
                 "param": failure.param}  # fmt: skip
        return self.writer.failed(error)


class _MessagesDoor(_Door):
    def __init__(self, parsed: ChatRequest, same_api: bool) -> None:
        self.parsed, self.same_api = parsed, same_api
        self.writer: MessagesWriter | None = None
        self.id = item_id("msg")

    def _id(self, answer: Answer | None) -> str:
        wire = _wire(answer) if answer else None
        native = (wire or {}).get("reply", {}).get("id") if wire else None
        return str(native) if native and wire and wire.get("api") == "messages" else self.id

    def body(self, answer: Answer) -> dict[str, Any]:
        wire = _wire(answer)
        return {
            "id": self._id(answer),
            "type": "message",
            "role": "assistant",
            "model": answer.data.get("model") or self.parsed.params.get("model") or "",
            "content": message_blocks(answer.message, wire),
            "stop_reason": stop_reason(answer.reason, wire),
            "stop_sequence": None,
            "usage": messages_usage(answer.data.get("usage"), wire),
        }

    def error(self, failure: Failure) -> Response:
        return failure.anthropic()

    def start(self, first: StreamPiece | Answer) -> bytes:
        model = self.parsed.params.get("model") or ""
        if isinstance(first, StreamPiece):
            model = first.envelope.get("model") or model
            if self.same_api and first.envelope.get("id"):  # the upstream's own message id
                self.id = str(first.envelope["id"])
        elif self.same_api:
            self.id = self._id(first)
        message = {"id": self.id, "type": "message", "role": "assistant", "model": model,
                   "usage": {"input_tokens": 0, "output_tokens": 0}}  # fmt: skip
        self.writer = MessagesWriter(start_message=message, show_thinking=self.same_api)
        return self.writer.start()

    def piece(self, piece: StreamPiece) -> bytes:
        assert self.writer is not None
        return self.writer.piece(piece)

    def finish(self, answer: Answer) -> bytes:
        assert self.writer is not None
        wire = _wire(answer)
        blocks = message_blocks(answer.message, wire)
        usage = messages_usage(answer.data.get("usage"), wire)
        return self.writer.finish(blocks, answer.call, stop_reason(answer.reason, wire), usage)

    def failed(self, failure: Failure) -> bytes:
        return MessagesWriter.failed(failure.anthropic_error())


async def _stream(
    proxy: KeeperProxy,
    name: str,
    parsed: ChatRequest,
    auth: str | None,
    headers: dict[str, str],
    door: _Door,
    retry: RetryPolicy,
) -> Response:
    """Stream the answer in the door's events: text as the upstream sends it, the rest once the
    reply is known. An error before the first byte is an ordinary error response."""
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    async def forward(piece: StreamPiece) -> None:
        await queue.put(("delta", piece))

    async def run() -> None:
        try:
            await queue.put(("done", await proxy.chat(name, parsed, auth, forward)))
        except Exception as exc:
            await queue.put(("error", exc))

    task = asyncio.create_task(run())
    kind, value = await queue.get()
    if kind == "error":
        return door.error(failure_of(value, name, retry))

    async def events() -> AsyncIterator[bytes]:
        nonlocal kind, value
        yield door.start(value)
        try:
            while True:
                if kind == "delta":
                    yield door.piece(value)
                elif kind == "error":
                    yield door.failed(failure_of(value, name, retry))
                    return
                else:
                    yield door.finish(value)
                    return
                kind, value = await queue.get()
        finally:  # a client that hung up leaves the turn to finish and be kept
            _RUNNING.add(task)
            task.add_done_callback(_RUNNING.discard)

    return StreamingResponse(
        events(), media_type="text/event-stream", headers={**headers, "cache-control": "no-cache"}
    )
