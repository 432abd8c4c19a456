"""The keeper as an OpenAI-compatible proxy in front of a model server.

An agent that sends its whole history on every call and manages nothing points its base URL here.
For each ``POST /v1/chat/completions`` the proxy takes the agent's new messages into its session
(``proxy_session``), runs the keeper step before every upstream call (notes are asked in place, on
the conversation the server has already read, rendered exactly like a main call), sends the
upstream at most the live window, answers the model's archive searches itself, and returns only
the final reply. The engine is the same ``Keeper`` the LangGraph node drives; this module only
converts formats and does I/O.

Per session it keeps, in one archive file under ``archive_dir``: the turns that left the window,
every NOTES version, the window itself and a fingerprint per agent message, so a restarted proxy
continues every session. Two requests of one session never run at once (the second waits).

    keeper-proxy --upstream http://127.0.0.1:8000/v1 --window 32768
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from keeper_middleware.config import KeeperConfig, ThinkingPolicy
from keeper_middleware.errors import WindowTooSmallError
from keeper_middleware.integrations.openai_format import (
    SEARCH_TOOL_SCHEMA,
    ChatRequest,
    RequestError,
    agent_reply,
    ai_from_completion,
    completion_body,
    digest_of,
    error_body,
    message_from_openai,
    parse_chat_request,
    sse_events,
    upstream_body,
)
from keeper_middleware.integrations.proxy_session import (
    RECORD_KEY,
    SESSION_HEADER,
    ProxyStats,
    SessionIdError,
    SessionRecord,
    StoredRecord,
    render_metrics,
    resolve_session,
    take_in,
)
from keeper_middleware.integrations.proxy_upstream import RetryPolicy, Upstream, UpstreamError
from keeper_middleware.keeper import Keeper, ModelSetup
from keeper_middleware.notes import render_notes
from keeper_middleware.retrievers.base import Retriever
from keeper_middleware.search import SEARCH_TOOL_NAME
from keeper_middleware.tokens import TokenCounter

__all__ = [
    "ARCHIVE_FILE",
    "KeeperProxy",
    "RetryPolicy",
    "Upstream",
    "UpstreamError",
    "create_proxy_app",
    "session_report",
]

ARCHIVE_FILE = "keeper.sqlite3"
MAX_BODY_BYTES = 32 * 1024 * 1024
_NOT_FOR_NOTES = ("tool_choice", "response_format", "n", "logprobs", "top_logprobs")
_log = logging.getLogger(__name__)


# -------------------------------------------------------------------- the engine driver


def _new_id() -> str:
    return f"p-{uuid.uuid4().hex[:16]}"


@dataclass(frozen=True, slots=True)
class _Turn:
    """One request in flight: what every upstream call of it shares."""

    session: str
    setup: ModelSetup
    tools: tuple[dict[str, Any], ...]
    params: Mapping[str, Any]
    note_params: Mapping[str, Any]
    auth: str | None


class KeeperProxy:
    """Drives the keeper engine for every session; the ASGI app is a thin layer over it."""

    def __init__(self, keeper: Keeper, upstream: Upstream, *, max_upstream_calls: int) -> None:
        if max_upstream_calls < 1:
            raise ValueError("max_upstream_calls must be at least 1")
        self.keeper = keeper
        self.upstream = upstream
        self.max_upstream_calls = max_upstream_calls
        self._locks: dict[str, asyncio.Lock] = {}
        self._records: dict[str, StoredRecord] = {}
        self._stats: dict[str, ProxyStats] = {}
        self._fingerprints: dict[str, tuple[tuple[int | None, str], ...]] = {}

    # ---------------------------------------------------------------- per-session state

    def record(self, session: str) -> SessionRecord:
        return self._stored(session).record

    def _stored(self, session: str) -> StoredRecord:
        if session not in self._records:
            archive = self.keeper.archive
            self._records[session] = StoredRecord.load(
                archive.get_value(session, RECORD_KEY), lambda key: archive.get_value(session, key)
            )
        return self._records[session]

    def _save(self, session: str, record: SessionRecord) -> None:
        stored, writes, stale = self._stored(session).saved(record)
        for key, value in writes.items():  # the head comes last
            self.keeper.archive.put_value(session, key, value)
        self._records[session] = stored
        for key in stale:
            self.keeper.archive.put_value(session, key, None)

    def stats(self, session: str) -> ProxyStats:
        if session not in self._stats:
            self._stats[session] = ProxyStats.from_json(
                self.keeper.archive.get_value(session, "proxy_counters")
            )
        return self._stats[session]

    def sessions(self) -> list[str]:
        return self.keeper.archive.sessions()

    # ---------------------------------------------------------------- one request

    async def chat(
        self, session: str, request: ChatRequest, auth: str | None
    ) -> tuple[dict[str, Any], dict[str, Any], str]:
        """Answer one chat request: (upstream envelope, the agent's message, finish reason)."""
        lock = self._locks.setdefault(session, asyncio.Lock())
        async with lock:
            started = time.perf_counter()
            stats = self.stats(session)
            waited_before = stats.upstream_seconds
            stats.requests += 1
            try:
                pairs = request.digests_reusing(self._fingerprints.get(session, ()))
                self._fingerprints[session] = pairs
                digests = [digest for _, digest in pairs]
                intake = take_in(self.record(session), request.messages, digests, _new_id)
                stats.withdrawn_messages += intake.withdrawn
                self._save(session, intake.record)
                return await self._answer(self._turn(session, request, auth))
            except UpstreamError:
                stats.upstream_failures += 1
                raise
            finally:
                elapsed = time.perf_counter() - started
                stats.added_seconds += max(0.0, elapsed - (stats.upstream_seconds - waited_before))
                self.keeper.archive.put_value(session, "proxy_counters", stats.to_json())

    def _turn(self, session: str, request: ChatRequest, auth: str | None) -> _Turn:
        own = [t["function"]["name"] for t in request.tools]
        tools = request.tools if SEARCH_TOOL_NAME in own else (*request.tools, SEARCH_TOOL_SCHEMA)
        note_params = {k: v for k, v in request.params.items() if k not in _NOT_FOR_NOTES}
        return _Turn(
            session=session,
            setup=ModelSetup(system_prompt=request.system_prompt, tools=tuple(tools)),
            tools=tuple(tools),
            params=request.params,
            note_params=note_params,
            auth=auth,
        )

    async def _answer(self, turn: _Turn) -> tuple[dict[str, Any], dict[str, Any], str]:
        session, keeper = turn.session, self.keeper
        searching = any(t is SEARCH_TOOL_SCHEMA for t in turn.tools)

        async def note_call(messages: list[BaseMessage], kwargs: Mapping[str, Any]) -> AIMessage:
            body = upstream_body(messages, turn.tools, turn.note_params, kwargs)
            return ai_from_completion(await self._call(turn, body))

        for number in range(1, self.max_upstream_calls + 1):
            record = self.record(session)
            step = await keeper.astep(
                session, list(record.window), record.keeper_state, turn.setup, note_call
            )
            record = replace(record, window=tuple(step.messages), keeper_state=step.state)
            self._save(session, record)
            data = await self._main_call(turn, record.window)
            reply = keeper.record_reply(session, ai_from_completion(data))
            reply = reply.model_copy(update={"id": _new_id()})
            searches = [c for c in reply.tool_calls if c["name"] == SEARCH_TOOL_NAME]
            broken = [c for c in reply.invalid_tool_calls if c["name"] == SEARCH_TOOL_NAME]
            if searching and (searches or broken) and number < self.max_upstream_calls:
                self._save(session, record.appended(self._run_searches(session, reply)))
                self.stats(session).search_rounds += 1
                continue
            if searching and (searches or broken):
                self.stats(session).loop_limit_hits += 1
            return self._finish(session, record, data, reply, hidden=searching)
        raise AssertionError("unreachable: the last call always finishes")

    async def _main_call(self, turn: _Turn, window: tuple[BaseMessage, ...]) -> dict[str, Any]:
        """A work call; a reply that thought to its limit is asked again without thinking."""
        kwargs = self.keeper.work_kwargs(turn.session, window)
        messages = turn.setup.render(window)
        data = await self._call(turn, upstream_body(messages, turn.tools, turn.params, kwargs))
        retry = self.keeper.retry_kwargs(turn.session, kwargs, ai_from_completion(data))
        if retry is not None:
            data = await self._call(turn, upstream_body(messages, turn.tools, turn.params, retry))
        return data

    async def _call(self, turn: _Turn, body: dict[str, Any]) -> dict[str, Any]:
        stats = self.stats(turn.session)
        started = time.perf_counter()
        try:
            data, retries = await self.upstream.chat(body, auth=turn.auth)
        finally:
            stats.upstream_seconds += time.perf_counter() - started
        stats.upstream_calls += 1
        stats.upstream_retries += retries
        return data

    def _run_searches(self, session: str, reply: AIMessage) -> list[BaseMessage]:
        """The model's searches answered by the proxy: the call (searches only) and its results."""
        calls = [c for c in reply.tool_calls if c["name"] == SEARCH_TOOL_NAME]
        broken = [c for c in reply.invalid_tool_calls if c["name"] == SEARCH_TOOL_NAME]
        asked = reply.model_copy(update={"tool_calls": calls, "invalid_tool_calls": broken})
        results: list[BaseMessage] = [asked]
        for call in calls:
            args = call["args"]
            text = self.keeper.search(
                session,
                str(args.get("query") or ""),
                _item(args.get("from_item")),
                _item(args.get("to_item")),
            )
            results.append(_search_result(call["id"], text))
        for bad in broken:
            text = 'Refused: the arguments were not a JSON object like {"query": "a name"}.'
            results.append(_search_result(bad["id"], text))
        return results

    def _finish(
        self,
        session: str,
        record: SessionRecord,
        data: dict[str, Any],
        reply: AIMessage,
        *,
        hidden: bool,
    ) -> tuple[dict[str, Any], dict[str, Any], str]:
        """Keep the final reply (without the proxy's own search calls, if it still had some at
        the call limit) and give the agent exactly that."""
        hide = SEARCH_TOOL_NAME if hidden else None
        message, reason = agent_reply(data, hide)
        kept = reply.model_copy(
            update={
                "tool_calls": [c for c in reply.tool_calls if c["name"] != hide],
                "invalid_tool_calls": [c for c in reply.invalid_tool_calls if c["name"] != hide],
            }
        )
        digest = digest_of(message_from_openai(message))
        self._save(
            session,
            replace(
                record,
                window=(*record.window, kept),
                taken=(*record.taken, (digest, str(kept.id))),
            ),
        )
        return data, message, reason

    async def aclose(self) -> None:
        await self.upstream.aclose()
        self.keeper.close()


def _item(value: object) -> int | None:
    """An item bound from the model's arguments; anything unreadable means no bound."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _search_result(call_id: str | None, text: str) -> ToolMessage:
    return ToolMessage(
        content=text, tool_call_id=call_id or "", name=SEARCH_TOOL_NAME, id=_new_id()
    )


# -------------------------------------------------------------------- the ASGI layer


def _error(
    status: int, message: str, *, kind: str, code: str | None = None, param: str | None = None
) -> JSONResponse:
    return JSONResponse(error_body(message, kind=kind, code=code, param=param), status_code=status)


class _ApiKey:
    """Every route needs ``Authorization: Bearer <key>`` when a key is set."""

    def __init__(self, app: ASGIApp, key: str | None) -> None:
        self.app = app
        self.expected = f"Bearer {key}".encode() if key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.expected is not None:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                response = _error(
                    401,
                    "Missing or wrong API key: send 'Authorization: Bearer <key>'.",
                    kind="authentication_error",
                    code="invalid_api_key",
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _read_json(request: Request, limit: int) -> object:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise RequestError(f"The request is larger than {limit} bytes.", status=413)
    size, chunks = 0, []
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(f"The request is larger than {limit} bytes.", status=413)
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except ValueError as exc:
        raise RequestError(f"The request body is not valid JSON: {exc}.") from exc


def create_proxy_app(
    upstream_url: str,
    *,
    window: int,
    archive_dir: str | Path,
    api_key: str | None = None,
    upstream_api_key: str | None = None,
    reasoning_effort: str | None = None,
    config: KeeperConfig | None = None,
    retry: RetryPolicy | None = None,
    max_upstream_calls: int = 12,
    max_body_bytes: int = MAX_BODY_BYTES,
    token_counter: TokenCounter | str | None = None,
    retriever: Retriever | str | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> Starlette:
    """The proxy as a Starlette app; ``app.state.proxy`` is its :class:`KeeperProxy`.

    ``upstream_url`` is the base URL an agent would otherwise use (ending in ``/v1``). ``config``
    overrides the keeper's settings (its ``window`` is replaced by ``window``; without it the
    reply reserve is 4096 tokens or a quarter of a smaller window); ``transport``
    replaces the network (tests pass ``httpx.MockTransport``).
    """
    base = config or KeeperConfig(window=window, reply_reserve=min(4096, window // 4))
    thinking = base.thinking
    if reasoning_effort is not None:
        thinking = ThinkingPolicy(
            on=thinking.on,
            off=thinking.off,
            reasoning_effort=reasoning_effort,
            retry_empty_without_thinking=thinking.retry_empty_without_thinking,
            sample_after_stop=thinking.sample_after_stop,
        )
    keeper_config = replace(base, window=window, thinking=thinking)
    folder = Path(archive_dir)
    folder.mkdir(parents=True, exist_ok=True)
    keeper = Keeper(
        keeper_config,
        archive=folder / ARCHIVE_FILE,
        retriever=retriever,
        token_counter=token_counter,
    )
    upstream = Upstream(
        upstream_url,
        api_key=upstream_api_key,
        forward_auth=api_key is None,
        retry=retry or RetryPolicy(),
        transport=transport,
    )
    proxy = KeeperProxy(keeper, upstream, max_upstream_calls=max_upstream_calls)

    async def chat_completions(request: Request) -> Response:
        try:
            parsed = parse_chat_request(await _read_json(request, max_body_bytes))
            session = resolve_session(
                request.headers.get(SESSION_HEADER), parsed.system_prompt, parsed.messages
            )
        except RequestError as exc:
            return _error(exc.status, exc.message, kind="invalid_request_error", param=exc.param)
        except SessionIdError as exc:
            return _error(400, str(exc), kind="invalid_request_error", code="invalid_session")
        try:
            data, message, reason = await proxy.chat(
                session, parsed, request.headers.get("authorization")
            )
        except UpstreamError as exc:
            return _error(exc.status, exc.message, kind="upstream_error", code=exc.code)
        except WindowTooSmallError as exc:
            return _error(
                400, str(exc), kind="invalid_request_error", code="context_length_exceeded"
            )
        except Exception as exc:  # reported as JSON; the session is saved before any call
            _log.exception("keeper proxy failed on session %s", session)
            return _error(500, f"The keeper proxy failed: {exc!r}", kind="server_error")
        headers = {SESSION_HEADER: session}
        if not parsed.stream:
            return JSONResponse(completion_body(data, message, reason), headers=headers)
        events = sse_events(data, message, reason, include_usage=parsed.include_usage)
        return StreamingResponse(
            events, media_type="text/event-stream", headers={**headers, "cache-control": "no-cache"}
        )

    async def models(request: Request) -> Response:
        try:
            status, content = await upstream.get(
                "/models", auth=request.headers.get("authorization")
            )
        except UpstreamError as exc:
            return _error(exc.status, exc.message, kind="upstream_error", code=exc.code)
        return Response(content, status_code=status, media_type="application/json")

    async def session_info(request: Request) -> Response:
        session = request.path_params["session"]
        try:
            resolve_session(session, None, ())
        except SessionIdError as exc:
            return _error(400, str(exc), kind="invalid_request_error", code="invalid_session")
        if session not in proxy.sessions():
            return _error(404, f"No session {session!r} on this proxy.", kind="not_found_error")
        return JSONResponse(session_report(proxy, session))

    async def metrics(request: Request) -> Response:
        text = render_metrics({s: (keeper.counters(s), proxy.stats(s)) for s in proxy.sessions()})
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    async def not_found(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        return _error(
            status,
            f"{request.method} {request.url.path} is not served here.",
            kind="invalid_request_error",
        )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await proxy.aclose()

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/keeper/sessions/{session}", session_info, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
        ],
        middleware=[Middleware(_ApiKey, key=api_key)],
        exception_handlers={404: not_found, 405: not_found},
        lifespan=lifespan,
    )
    app.state.proxy = proxy
    return app


def session_report(proxy: KeeperProxy, session: str) -> dict[str, Any]:
    """What ``GET /keeper/sessions/{id}`` shows: the notes, the counters, the archive's size."""
    keeper = proxy.keeper
    record = proxy.record(session)
    return {
        "session": session,
        "notes": render_notes(keeper.notes(session)),
        "notes_versions": sum(1 for _ in keeper.archive.notes_versions(session)),
        "archive_turns": keeper.archive.turn_count(session),
        "window_messages": len(record.window),
        "window_tokens": keeper.tokens.count_messages(list(record.window)),
        "agent_messages": len(record.taken),
        "counters": keeper.counters(session).to_json(),
        "cached_ratio": keeper.counters(session).cached_ratio,
        "proxy": proxy.stats(session).to_json(),
    }
