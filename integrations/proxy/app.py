"""The keeper proxy as a Starlette app: routes, keys, errors, and streaming to the agent.

Routes: ``POST /v1/chat/completions``, ``POST /v1/responses`` and ``POST /v1/messages`` (the
agent's calls, in the API it speaks: :mod:`.doors.routes`), ``GET /v1/models`` (passed through),
``GET /keeper/sessions`` (the caller's sessions), ``GET`` and ``DELETE /keeper/sessions/{id}``
(one session's notes and counters; forgetting it), ``GET /metrics`` (Prometheus). Every route
serves only the caller's tenant (see :mod:`.sessions.tenants`); an admin key names another tenant's
session as ``<tenant>:<id>``.

A streaming request gets the upstream's text as it arrives (:mod:`.chat_completions.streams`); an error before
the first byte is an ordinary JSON error with its status, one after it an error event. The
agents' three ``POST`` routes skip Starlette's layers (:mod:`.doors.dispatch`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import httpx
import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from keeper_middleware.config import KeeperConfig, ThinkingPolicy
from keeper_middleware.errors import ConfigurationError, WindowTooSmallError
from keeper_middleware.integrations.proxy.chat_completions.replies import (
    completion_body,
    logprobs_after,
)
from keeper_middleware.integrations.proxy.chat_completions.streams import (
    StreamPiece,
    chunk_envelope,
    sse_delta,
    sse_event,
    sse_finish,
    sse_start,
)
from keeper_middleware.integrations.proxy.conversation.chat_request import parse_chat_request
from keeper_middleware.integrations.proxy.conversation.form import RequestError, error_body
from keeper_middleware.integrations.proxy.doors.dispatch import ProxyApp, read_json
from keeper_middleware.integrations.proxy.doors.errors import JsonReply
from keeper_middleware.integrations.proxy.doors.routes import FrontDoors
from keeper_middleware.integrations.proxy.sessions.engine import Answer, KeeperProxy
from keeper_middleware.integrations.proxy.sessions.metrics import SessionCounters, metrics_registry
from keeper_middleware.integrations.proxy.sessions.quota import QuotaError
from keeper_middleware.integrations.proxy.sessions.records import SessionStore
from keeper_middleware.integrations.proxy.sessions.tenants import (
    SESSION_HEADER,
    Caller,
    SessionIdError,
    Tenants,
    check_name,
    resolve_session,
    split_stored,
    stored_name,
)
from keeper_middleware.integrations.proxy.slots.parking import SlotParking, SlotParkingConfig
from keeper_middleware.integrations.proxy.upstream.apis import upstream_api as make_upstream_api
from keeper_middleware.integrations.proxy.upstream.client import (
    RetryPolicy,
    Upstream,
    UpstreamError,
    retry_after_header,
)
from keeper_middleware.keeper import Keeper
from keeper_middleware.notes.block import render_notes
from keeper_middleware.retrievers.base import Retriever
from keeper_middleware.tokens.counting import TokenCounter

__all__ = ["ARCHIVE_FILE", "MAX_BODY_BYTES", "create_proxy_app", "session_report"]

ARCHIVE_FILE = "keeper.sqlite3"
MAX_BODY_BYTES = 32 * 1024 * 1024
_log = logging.getLogger(__name__)
_RUNNING: set[asyncio.Task[None]] = set()


class _RefusedError(Exception):
    def __init__(self, response: Response) -> None:
        self.response = response


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return JsonReply(body, status, headers)


def _error(
    status: int,
    message: str,
    *,
    kind: str,
    code: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    return _json(error_body(message, kind=kind, code=code, param=param), status, headers)


def _keeper_config(
    window: int, config: KeeperConfig | None, reasoning_effort: str | None
) -> KeeperConfig:
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
    return replace(base, window=window, thinking=thinking)


def create_proxy_app(
    upstream_url: str,
    *,
    window: int,
    archive_dir: str | Path | None = None,
    archive_url: str | None = None,
    api_key: str | None = None,
    tenants: Tenants | None = None,
    require_session: bool = False,
    metrics_per_session: bool = False,
    tenant_quota_bytes: int | None = None,
    upstream_api_key: str | None = None,
    reasoning_effort: str | None = None,
    config: KeeperConfig | None = None,
    retry: RetryPolicy | None = None,
    max_upstream_calls: int = 12,
    max_body_bytes: int = MAX_BODY_BYTES,
    token_counter: TokenCounter | str | None = None,
    retriever: Retriever | str | None = None,
    store: SessionStore | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    slot_parking: SlotParkingConfig | None = None,
    upstream_api: str = "chat",
) -> Starlette:
    """The proxy as a Starlette app; ``app.state.proxy`` is its :class:`KeeperProxy`.

    ``upstream_url`` is the base URL an agent would otherwise use (ending in ``/v1``). Callers
    are identified by ``tenants`` (or the one ``api_key``, tenant ``default``; neither: no key
    needed). ``require_session`` refuses requests naming neither ``X-Keeper-Session`` nor
    ``user``. ``config`` overrides the keeper's settings (its ``window`` is replaced by
    ``window``; without it the reply reserve is 4096 tokens or a quarter of a smaller window);
    ``store`` replaces where session records live; ``transport`` replaces the network (tests
    pass ``httpx.MockTransport``). Everything is kept in ``archive_dir`` (SQLite, one process),
    or with ``archive_url`` (``postgresql://…``) in that database, where any number of replicas
    can serve any session: requests of one session take turns across replicas.
    ``slot_parking`` manages a llama.cpp upstream's slots: sessions are pinned to slots and the
    caches of evicted ones parked on disk (:mod:`.slots.parking`). ``upstream_api`` is the API the
    upstream speaks (``chat``, ``responses`` or ``messages``): clients of that API get it passed
    through, the others are translated (:mod:`.upstream.apis`); every front door
    (``/v1/chat/completions``, ``/v1/responses``, ``/v1/messages``) serves either way.
    """
    if max_body_bytes < 1:
        raise ConfigurationError("max_body_bytes must be a positive number of bytes")
    if tenants is not None and api_key is not None:
        raise ConfigurationError("give api_key or tenants, not both (a Tenants can hold that key)")
    callers = tenants or Tenants({api_key: "default"} if api_key else None)
    if (archive_dir is None) == (archive_url is None):
        raise ConfigurationError(
            "give archive_dir (a folder, SQLite) or archive_url (postgresql://…), exactly one"
        )
    archive: str | Path
    if archive_url is None:
        folder = Path(str(archive_dir))
        folder.mkdir(parents=True, exist_ok=True)
        archive = folder / ARCHIVE_FILE
    else:
        archive = archive_url
    keeper = Keeper(
        _keeper_config(window, config, reasoning_effort),
        archive=archive,
        retriever=retriever,
        token_counter=token_counter,
        unchanged_in_place=True,  # its window's messages are its own, replaced, never changed
    )
    retry = retry or RetryPolicy()
    upstream = Upstream(
        upstream_url,
        api_key=upstream_api_key,
        forward_auth=callers.open,
        retry=retry,
        transport=transport,
        api=make_upstream_api(upstream_api, reserve=keeper.config.reserve),
    )
    proxy = KeeperProxy(
        keeper,
        upstream,
        max_upstream_calls=max_upstream_calls,
        store=store,
        tenant_quota_bytes=tenant_quota_bytes,
        slots=None
        if slot_parking is None
        else SlotParking(slot_parking, upstream_url, transport=transport),
    )

    def caller_of(request: Request) -> Caller:
        caller = callers.identify(request.headers.get("authorization"))
        if caller is None:
            raise _RefusedError(
                _error(
                    401,
                    "Missing or wrong API key: send 'Authorization: Bearer <key>'.",
                    kind="authentication_error",
                    code="invalid_api_key",
                )
            )
        return caller

    def tenant_of(caller: Caller) -> str:
        if caller.tenant is None:
            raise _RefusedError(
                _error(403, "This key only reads /metrics.", kind="permission_error")
            )
        return caller.tenant

    def session_named(request: Request, caller: Caller) -> str:
        """The stored name of the path's session, within the caller's tenant (admin: any)."""
        given = request.path_params["session"]
        tenant = tenant_of(caller)
        if caller.admin and ":" in given:
            tenant, given = split_stored(given)
        try:
            return stored_name(check_name(tenant, "tenant"), check_name(given, "session"))
        except SessionIdError as exc:
            raise _RefusedError(
                _error(400, str(exc), kind="invalid_request_error", code="invalid_session")
            ) from exc

    async def chat_completions(request: Request) -> Response:
        try:
            caller = caller_of(request)
            tenant = tenant_of(caller)
            body = await read_json(request, max_body_bytes)
            header = request.headers.get(SESSION_HEADER)
            resent = None
            if header is not None:  # the session is known before the body is read
                resent = proxy.resent(stored_name(tenant, check_name(header, SESSION_HEADER)))
            parsed = parse_chat_request(body, resent)
            session = resolve_session(
                header,
                parsed.params.get("user"),
                parsed.system_prompt,
                parsed.messages,
                require=require_session,
            )
        except _RefusedError as refusal:
            return refusal.response
        except RequestError as exc:
            return _error(exc.status, exc.message, kind="invalid_request_error", param=exc.param)
        except SessionIdError as exc:
            return _error(400, str(exc), kind="invalid_request_error", code="invalid_session")
        name = stored_name(tenant, session)
        auth = request.headers.get("authorization")
        headers = {SESSION_HEADER: session}
        if parsed.stream:
            return await _stream(proxy, name, parsed, auth, headers)
        try:
            answer = await proxy.chat(name, parsed, auth)
        except Exception as exc:
            return _failure(exc, name, retry)
        return _json(_body(answer), headers=headers)

    async def models(request: Request) -> Response:
        try:
            tenant_of(caller_of(request))
            status, content = await upstream.get(
                "/models", auth=request.headers.get("authorization")
            )
        except _RefusedError as refusal:
            return refusal.response
        except UpstreamError as exc:
            return _error(exc.status, exc.message, kind="upstream_error", code=exc.code)
        return Response(content, status_code=status, media_type="application/json")

    async def session_list(request: Request) -> Response:
        try:
            caller = caller_of(request)
            tenant = tenant_of(caller)
        except _RefusedError as refusal:
            return refusal.response
        names = await asyncio.to_thread(proxy.sessions)
        rows = [split_stored(n) for n in names]
        if caller.admin:
            return _json({"sessions": [f"{t}:{s}" for t, s in rows]})
        return _json({"sessions": [s for t, s in rows if t == tenant]})

    async def session_info(request: Request) -> Response:
        try:
            name = session_named(request, caller_of(request))
        except _RefusedError as refusal:
            return refusal.response
        report = await asyncio.to_thread(
            lambda: session_report(proxy, name) if name in proxy.sessions() else None
        )
        if report is None:
            return _not_found(request.path_params["session"])
        return _json(report)

    async def session_delete(request: Request) -> Response:
        try:
            name = session_named(request, caller_of(request))
        except _RefusedError as refusal:
            return refusal.response
        if not await proxy.forget(name):
            return _not_found(request.path_params["session"])
        return _json({"session": split_stored(name)[1], "deleted": True})

    def counters() -> Iterator[SessionCounters]:
        for name in proxy.sessions():
            tenant, session = split_stored(name)
            yield SessionCounters(
                tenant, session, keeper.counters(name).to_json(), proxy.stats(name).to_json()
            )

    def slot_counters() -> dict[str, Any]:
        assert proxy.slots is not None
        return asdict(proxy.slots.counters)

    registry = metrics_registry(
        counters,
        per_session=metrics_per_session,
        slots=slot_counters if proxy.slots is not None else None,
    )

    async def metrics(request: Request) -> Response:
        try:
            caller = caller_of(request)
        except _RefusedError as refusal:
            return refusal.response
        if not callers.may_read_metrics(caller):
            return _error(403, "/metrics needs the metrics key.", kind="permission_error")
        text = await asyncio.to_thread(generate_latest, registry)
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    async def not_found(request: Request, exc: Exception) -> Response:
        """An unknown route (or method) is named only to a caller with a key: without one, every
        path answers 401 alike, so no one learns what is served here without a key."""
        try:
            caller_of(request)
        except _RefusedError as refusal:
            return refusal.response
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

    doors = FrontDoors(
        proxy,
        callers,
        retry,
        lambda request: read_json(request, max_body_bytes),
        require_session=require_session,
    )
    app = ProxyApp(
        hot={
            "/v1/chat/completions": chat_completions,
            "/v1/responses": doors.responses,
            "/v1/messages": doors.messages,
        },
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            *doors.routes(),
            Route("/v1/models", models, methods=["GET"]),
            Route("/keeper/sessions", session_list, methods=["GET"]),
            Route("/keeper/sessions/{session}", session_info, methods=["GET"]),
            Route("/keeper/sessions/{session}", session_delete, methods=["DELETE"]),
            Route("/metrics", metrics, methods=["GET"]),
        ],
        exception_handlers={404: not_found, 405: not_found},
        lifespan=lifespan,
    )
    app.state.proxy = proxy
    app.state.tenants = callers
    return app


def _not_found(session: str) -> Response:
    return _error(404, f"No session {session[:128]!r} here.", kind="not_found_error")


def _body(answer: Answer) -> dict[str, Any]:
    body = completion_body(answer.data, answer.message, answer.reason)
    if answer.usage is not None:
        body["usage"] = answer.usage
    return body


def _failure(exc: Exception, session: str, retry: RetryPolicy) -> Response:
    """The agent's error response for a request that failed."""
    if isinstance(exc, UpstreamError):
        return _error(
            exc.status,
            exc.message,
            kind="upstream_error",
            code=exc.code,
            headers=retry_after_header(exc, retry),
        )
    if isinstance(exc, RequestError):
        return _error(exc.status, exc.message, kind="invalid_request_error", param=exc.param)
    if isinstance(exc, WindowTooSmallError):
        return _error(400, str(exc), kind="invalid_request_error", code="context_length_exceeded")
    if isinstance(exc, QuotaError):
        return _error(413, str(exc), kind="invalid_request_error", code="quota_exceeded")
    _log.exception("keeper proxy failed on session %s", session, exc_info=exc)
    return _error(500, f"The keeper proxy failed: {exc!r}", kind="server_error")


async def _stream(
    proxy: KeeperProxy, name: str, parsed: Any, auth: str | None, headers: dict[str, str]
) -> Response:
    """Stream the answer: text as the upstream sends it, the rest once the reply is known."""
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
        return _failure(value, name, proxy.upstream.retry)

    async def events() -> AsyncIterator[bytes]:
        nonlocal kind, value
        # the upstream's envelope from the first chunk on, for the whole stream
        envelope = chunk_envelope(value.envelope if kind == "delta" else value.data)
        yield sse_start(envelope)
        try:
            while True:
                if kind == "delta":
                    yield sse_delta(envelope, value)
                elif kind == "error":
                    failed = _failure(value, name, proxy.upstream.retry)
                    yield sse_event(orjson.loads(bytes(failed.body)))
                    yield b"data: [DONE]\n\n"
                    return
                else:
                    answer: Answer = value
                    usage = answer.usage if parsed.include_usage else None
                    for event in sse_finish(
                        envelope,
                        answer.message,
                        answer.reason,
                        already=answer.streamed,
                        usage=usage,
                        logprobs=logprobs_after(answer.data, answer.streamed_logprobs),
                    ):
                        yield event
                    return
                kind, value = await queue.get()
        finally:  # an agent that hung up leaves the turn to finish and be kept
            _RUNNING.add(task)
            task.add_done_callback(_RUNNING.discard)

    return StreamingResponse(
        events(), media_type="text/event-stream", headers={**headers, "cache-control": "no-cache"}
    )


def session_report(proxy: KeeperProxy, session: str) -> dict[str, Any]:
    """What ``GET /keeper/sessions/{id}`` shows: the notes, the counters, the archive's size."""
    keeper = proxy.keeper
    record = proxy.record(session)
    return {
        "session": split_stored(session)[1],
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
