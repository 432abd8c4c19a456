"""The Responses and Messages front doors: ``POST /v1/responses`` and ``POST /v1/messages``.

Both lead to the same keeper, tenants, sessions, quotas, metrics and archive as
``/v1/chat/completions``: the request is read into the internal model
(``responses.requests``, ``messages.requests``), the engine answers it, and the answer goes
back as the API's own JSON or server-sent events (``responses.client_events``, ``messages.client_events``), with errors in the API's
own shape (:mod:`.answers`, :mod:`.errors`). Keys are read from
``Authorization: Bearer`` and, for Messages, ``x-api-key``.

A session is named, within the caller's tenant, by the first of: ``X-Keeper-Session``; the
client's own conversation header (Codex's ``session-id``, Claude Code's
``X-Claude-Code-Session-Id``); Responses' ``prompt_cache_key``; the session id Claude Code puts in
``metadata.user_id``; else a hash of the end user, the system prompt and the first user message
(:func:`~.tenants.fallback_session`). Responses' ``previous_response_id`` names the session
that gave that response: the proxy's response ids are opaque, and the archive keeps what each
stands for (:mod:`.response_ids`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from keeper_middleware.integrations.proxy.conversation.form import ChatRequest, RequestError
from keeper_middleware.integrations.proxy.conversation.params import claude_session_of, user_of
from keeper_middleware.integrations.proxy.doors.answers import (
    Door,
    MessagesDoor,
    ResponsesDoor,
    stream_answer,
)
from keeper_middleware.integrations.proxy.doors.errors import Failure, failure_of, json_response
from keeper_middleware.integrations.proxy.doors.response_ids import ResponseIds
from keeper_middleware.integrations.proxy.messages.requests import parse_messages_request
from keeper_middleware.integrations.proxy.responses.requests import parse_responses_request
from keeper_middleware.integrations.proxy.sessions.engine import KeeperProxy
from keeper_middleware.integrations.proxy.sessions.tenants import (
    SESSION_HEADER,
    Caller,
    SessionIdError,
    Tenants,
    check_name,
    fallback_session,
    stored_name,
)
from keeper_middleware.integrations.proxy.upstream.client import RetryPolicy

__all__ = ["FrontDoors", "front_session"]

_log = logging.getLogger(__name__)
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
CLIENT_SESSION_HEADERS = {
    "responses": (("session-id", "codex"),),
    "messages": (("x-claude-code-session-id", "claude"),),
}
"""The conversation headers of the clients people run, and the prefix their sessions get."""


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


def _compacted(headers: Mapping[str, str]) -> bool:
    """Whether Codex says this request follows one of its own compactions (its window number,
    the part after the colon of ``x-codex-window-id``, is past 0)."""
    window = headers.get("x-codex-window-id") or ""
    number = window.rpartition(":")[2]
    return number.isdigit() and int(number) > 0


# ---------------------------------------------------------------------------- the doors


@dataclass
class FrontDoors:
    """The two front doors over one :class:`KeeperProxy` (``create_proxy_app`` builds them)."""

    proxy: KeeperProxy
    callers: Tenants
    retry: RetryPolicy
    read_json: Callable[[Request], Awaitable[object]]
    require_session: bool = False
    ids: ResponseIds = field(init=False)

    def __post_init__(self) -> None:
        self.ids = ResponseIds(self.proxy.keeper.archive)

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
        tenant = caller.tenant
        try:
            parsed = parse_responses_request(await self.read_json(request))
            session, parsed = await self._responses_session(request, tenant, parsed)
            if parsed.continues is None and _compacted(request.headers):
                parsed = replace(parsed, keep_dropped=True)
            stored = parsed.params.get("store") is not False
            answer_id, reply_id = await asyncio.to_thread(
                self.ids.issue, tenant, session, stored=stored
            )
        except Exception as exc:  # an archive failure too, told as the chat door tells it
            return failure_of(exc, "", self.retry).openai()
        name = stored_name(tenant, session)
        auth = request.headers.get("authorization")
        parsed = replace(parsed, reply_id=reply_id)
        door = ResponsesDoor(parsed, answer_id, stored, int(time.time()))
        return await self._answer(name, session, parsed, auth, door)

    async def _responses_session(
        self, request: Request, tenant: str, parsed: ChatRequest
    ) -> tuple[str, ChatRequest]:
        """The session, and the request marked as a continuation when it names a previous
        response (then it is that response's session, which must be the caller's tenant's)."""
        given = parsed.params.get("previous_response_id")
        if not given:
            return front_session(request.headers, parsed, require=self.require_session), parsed
        session, reply = await asyncio.to_thread(self.ids.resolve, tenant, str(given))
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
        door = MessagesDoor(parsed, self.proxy.upstream.api.name == "messages")
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
        return json_response({"input_tokens": count})

    async def _answer(
        self, name: str, session: str, parsed: ChatRequest, auth: str | None, door: Door
    ) -> Response:
        headers = {SESSION_HEADER: session}
        if parsed.stream:
            return await stream_answer(self.proxy, name, parsed, auth, headers, door, self.retry)
        try:
            answer = await self.proxy.chat(name, parsed, auth)
        except Exception as exc:
            return door.error(failure_of(exc, name, self.retry))
        return json_response(door.body(answer), headers=headers)
