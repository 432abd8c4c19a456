"""Drives the keeper engine for every session of the proxy (the ASGI app is a thin layer over it).

For each chat request the agent's messages are aligned with the session by content
(:mod:`.history`), the keeper step runs before every upstream call (notes asked in place,
rendered exactly like a main call), the upstream gets at most the live window, the model's
archive searches are answered here, and the final reply goes back to the agent. When a reply
mixes searches with the agent's own tool calls, the searches are answered (their results wait in
the window) and the agent gets its own calls.

Everything that touches SQLite or walks the whole history runs in worker threads, so the event
loop only moves bytes; two requests of one session never run at once (the second waits), also
across replicas on one PostgreSQL archive: the session is held in the database for the whole
request (:meth:`Keeper.asession`), and what this process remembers of it is read again first, so
any replica can serve any request of any session.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager, asynccontextmanager, nullcontext
from dataclasses import replace
from functools import partial
from operator import itemgetter
from typing import Any, ParamSpec, TypeVar

from langchain_core.messages import AIMessage, BaseMessage

from keeper_middleware.errors import ConfigurationError, InvalidStateError, WindowTooSmallError
from keeper_middleware.integrations.proxy.chat_completions.replies import (
    Completion,
    agent_reply,
    received_digest,
)
from keeper_middleware.integrations.proxy.chat_completions.streams import StreamPiece
from keeper_middleware.integrations.proxy.conversation.digests import message_key
from keeper_middleware.integrations.proxy.conversation.form import ChatRequest, RequestError
from keeper_middleware.integrations.proxy.conversation.resent import Resent
from keeper_middleware.integrations.proxy.sessions.history import continued, take_in
from keeper_middleware.integrations.proxy.sessions.last_requests import LastRequests
from keeper_middleware.integrations.proxy.sessions.metrics import ProxyStats
from keeper_middleware.integrations.proxy.sessions.quota import QuotaError, TenantQuota
from keeper_middleware.integrations.proxy.sessions.records import (
    ArchiveSessionStore,
    SessionRecord,
    SessionStore,
)
from keeper_middleware.integrations.proxy.sessions.searching import answer_searches
from keeper_middleware.integrations.proxy.sessions.setups import SessionSetups
from keeper_middleware.integrations.proxy.sessions.turns import Answer, Turn, new_id, shape_turn
from keeper_middleware.integrations.proxy.sessions.window_forms import WindowForms
from keeper_middleware.integrations.proxy.sessions.workers import Workers
from keeper_middleware.integrations.proxy.slots.parking import SlotParking
from keeper_middleware.integrations.proxy.upstream.client import Forward, Upstream, UpstreamError
from keeper_middleware.keeper import Keeper
from keeper_middleware.messages.facts import text_of
from keeper_middleware.search.schema import SEARCH_TOOL_NAME

__all__ = ["RUNNING", "WORKERS", "Answer", "KeeperProxy"]

WORKERS = 32
"""Worker threads at most (those waiting for a note call included)."""
RUNNING = 2
"""Worker threads that take jobs at once (:mod:`.workers`): more would only take turns at the
interpreter's lock, each hand-off costing CPU. A thread waiting for a note call makes room."""
P = ParamSpec("P")
R = TypeVar("R")


class KeeperProxy:
    """Drives the keeper engine for every session."""

    def __init__(
        self,
        keeper: Keeper,
        upstream: Upstream,
        *,
        max_upstream_calls: int,
        store: SessionStore | None = None,
        tenant_quota_bytes: int | None = None,
        workers: int = WORKERS,
        running: int | None = None,
        slots: SlotParking | None = None,
    ) -> None:
        if max_upstream_calls < 1:
            raise ConfigurationError("max_upstream_calls must be at least 1")
        self.quota = TenantQuota(tenant_quota_bytes, self.stats, self.sessions)
        self.keeper = keeper
        self.upstream = upstream
        self.max_upstream_calls = max_upstream_calls
        self.store: SessionStore = store or ArchiveSessionStore(
            keeper.archive,
            also=keeper.sessions.unsaved_values,
            saved_also=keeper.sessions.values_saved,
        )
        self.slots = slots
        self._resent = LastRequests()
        self.incremental = True
        """False: every request is read and matched whole, as if the session's last request
        were not known (the reference the incremental path is tested against)."""
        self._rendered: dict[str, WindowForms] = {}
        self._setups = SessionSetups()
        self._pool = (
            Workers(min(self._running(running), workers), workers, "keeper-proxy")
            if workers
            else None
        )

    def _running(self, running: int | None) -> int:
        """Threads that take jobs at once: ``RUNNING``, or on an archive shared between
        replicas (PostgreSQL), where a thread mostly waits for the database, as many as asked."""
        if running is not None:
            return running
        return WORKERS if self.keeper.sessions.shared else RUNNING

    async def _off_loop(self, func: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Run blocking work (SQLite, whole-history passes) in a worker thread (``workers=0``:
        on the loop, for profiling). The thread runs in a copy of this task's context, so it
        counts as holding the sessions the request holds."""
        if self._pool is None:
            return func(*args, **kwargs)
        return await self._pool.run(partial(func, *args, **kwargs))

    @asynccontextmanager
    async def _holding(self, session: str) -> AsyncIterator[None]:
        """Hold the session (in this process and, on a shared archive, in the database) and
        read again what another replica may have changed since this one last served it."""
        async with self.keeper.asession(session):
            await self._off_loop(self.store.refresh, session)
            yield

    # ---------------------------------------------------------------- per-session state

    def record(self, session: str) -> SessionRecord:
        return self.store.load(session)

    def resent(self, session: str) -> Resent | None:
        """The session's last chat request as this process saw it (content only: any replica's
        later requests leave it right), or None."""
        return self._resent.get(session) if self.incremental else None

    def stats(self, session: str) -> ProxyStats:
        return self.store.stats(session)

    def sessions(self) -> list[str]:
        return self.keeper.archive.sessions()

    async def forget(self, session: str) -> bool:
        """Erase a session: its archive, NOTES, index and record. False if there was none."""
        async with self._holding(session):
            if self.slots is not None:
                await self.slots.forget(session)
            return await self._off_loop(self._forget, session)

    def _forget(self, session: str) -> bool:
        if session not in self.sessions():
            self.keeper.sessions.drop(session)  # what a refused request read: nothing to write
            return False
        self.quota.erased(session)
        self.keeper.forget(session)
        self.store.forget(session)
        self._resent.forget(session)
        self._rendered.pop(session, None)
        self._setups.forget(session)
        return True

    # ---------------------------------------------------------------- one request

    async def chat(
        self,
        session: str,
        request: ChatRequest,
        auth: str | None,
        forward: Forward | None = None,
    ) -> Answer:
        """Answer one chat request; with ``forward``, plain text is streamed to it as it comes.
        What another replica may have changed is read again in the first worker-thread step
        (:meth:`_before_call`), not in a thread hop of its own."""
        saving: AbstractContextManager[None] = nullcontext()
        if isinstance(self.store, ArchiveSessionStore) and self.store.also is not None:
            # the keeper's counters go with the request's own save: one transaction
            saving = self.keeper.sessions.saving_later(session)
        async with self.keeper.sessions.ahold(session):  # Keeper.asession, one layer less
            with saving:
                turn = shape_turn(
                    session,
                    request,
                    auth,
                    forward,
                    reserve=self.keeper.config.reserve,
                    api=self.upstream.api,
                    setup=partial(self._setups.setup, session),
                )
                turn.reply_id = request.reply_id
                if self.slots is None:
                    return await self._served(turn, request)
                async with self.slots.lease(session) as lease:
                    turn.lease = lease
                    return await self._served(turn, request)

    async def _served(self, turn: Turn, request: ChatRequest) -> Answer:
        """The request answered; a failure leaves the session as a refused request would (a
        new session refused stores nothing) or counts the request's calls and time."""
        session = turn.session
        try:
            return await self._answer(turn, request)
        except (WindowTooSmallError, RequestError):
            if not turn.existed:  # a refused request stores nothing
                await self._off_loop(self._forget, session)
            raise
        except UpstreamError as error:
            if error.rejected and not turn.existed:  # refused upstream: as if refused here
                await self._off_loop(self._forget, session)
                raise
            self.stats(session).failed_requests += 1
            await self._off_loop(self._account, turn)
            raise
        except QuotaError:
            raise
        except BaseException:
            await self._off_loop(self._account, turn)
            raise

    def _account(self, turn: Turn) -> None:
        """Add the request's upstream calls and time to the session's counters and save them
        (with the record taken in, if it was not saved yet: a failed request keeps it)."""
        if turn.unsaved is not None:
            self.store.save_all(
                turn.session, turn.unsaved, turn.count_into(self.stats(turn.session))
            )
            turn.unsaved = None
        else:
            self.store.save_stats(turn.session, turn.count_into(self.stats(turn.session)))

    def _as_openai(self, session: str) -> WindowForms:
        """What the upstream reads of each window message, converted once per message."""
        forms = self._rendered.get(session)
        if forms is None:  # made once a session, not at every call
            forms = self._rendered[session] = WindowForms(self.upstream.api.render)
        return forms

    def _body(
        self,
        turn: Turn,
        messages: list[BaseMessage],
        tools: tuple[dict[str, Any], ...],
        params: Mapping[str, Any],
        kwargs: Mapping[str, Any],
    ) -> dict[str, Any]:
        """One upstream request in the upstream's API."""
        memo = self._as_openai(turn.session)
        return self.upstream.api.body(messages, tools, params, kwargs, memo, turn.context)

    def _work_body(
        self, turn: Turn, messages: list[BaseMessage], kwargs: Mapping[str, Any]
    ) -> dict[str, Any]:
        """A work call's request: the archive search left out once the session's searches have
        passed the stop line (then, with no tool left, no tool choice either)."""
        tools = turn.tools
        withheld = turn.search_tool is not None and not self.keeper.search_offered(turn.session)
        turn.withheld = withheld
        if withheld:
            tools = tuple(t for t in turn.tools if t is not turn.search_tool)
        body = self._body(turn, messages, tools, turn.params, kwargs)
        if withheld and not tools:  # no tool left to choose among
            body.pop("tool_choice", None)
            body.pop("parallel_tool_calls", None)
        return body

    def _intake(self, turn: Turn, request: ChatRequest) -> SessionRecord:
        """The record after taking in the request (not saved until the keeper step has
        accepted it: a refused request stores nothing)."""
        session = turn.session
        known = self._resent.get(session)
        pairs = request.digests_reusing(known.pairs if known is not None else ())
        messages: Sequence[BaseMessage] = request.messages
        record = self.record(session)
        if request.continues is not None:  # only what follows the session's latest response
            pairs, messages = continued(record, request, pairs)
        digests = list(map(itemgetter(1), pairs))
        archive = self.keeper.archive
        intake = take_in(
            record,
            messages,
            digests,
            new_id,
            lambda ids: archive.archived_ids(session, ids),
            keep_dropped=request.keep_dropped,
            incremental=self.incremental,
        )
        self.quota.charge(session, intake.added_chars)
        stats = self.stats(session)
        stats.withdrawn_messages += intake.withdrawn
        stats.returned_messages += intake.returned
        turn.resent = self._resent.keep(session, Resent(request.raw, pairs))
        return intake.record

    async def _answer(self, turn: Turn, request: ChatRequest) -> Answer:
        loop = asyncio.get_running_loop()

        async def note_call(messages: list[BaseMessage], kwargs: Mapping[str, Any]) -> AIMessage:
            body = self._body(turn, messages, turn.tools, turn.note_params, kwargs)
            return (await self._call(turn, body)).reply

        def sync_note_call(messages: list[BaseMessage], kwargs: Mapping[str, Any]) -> AIMessage:
            if self._pool is None:
                raise InvalidStateError("note calls need worker threads (workers >= 1)")
            called = asyncio.run_coroutine_threadsafe(note_call(messages, kwargs), loop)
            with self._pool.waiting():  # another thread takes jobs while this one waits
                return called.result()

        given: SessionRecord | None = None
        for number in range(1, self.max_upstream_calls + 1):
            record, kwargs, messages, body = await self._off_loop(
                self._before_call, turn, given, request, sync_note_call
            )
            done = await self._main_call(turn, kwargs, messages, body)
            outcome = await self._off_loop(self._after_call, turn, record, done, number)
            if isinstance(outcome, Answer):
                return outcome
            given = outcome
        raise AssertionError("unreachable: the last call always finishes")

    def _before_call(
        self,
        turn: Turn,
        record: SessionRecord | None,
        request: ChatRequest,
        note_call: Callable[[list[BaseMessage], Mapping[str, Any]], AIMessage],
    ) -> tuple[SessionRecord, dict[str, Any], list[BaseMessage], dict[str, Any]]:
        """In a worker thread: take the request in (first call), run the keeper step, and render
        the work call (its messages and its upstream body).

        The record is saved here only after a cut (the archive changed, so the record must
        follow it before anything else can fail); otherwise it is saved once, with the reply."""
        if record is None:
            self.store.refresh(turn.session)
            turn.existed = bool(self.store.load(turn.session).taken)
            record = self._intake(turn, request)
        step = self.keeper.step(
            turn.session, list(record.window), record.keeper_state, turn.setup, note_call
        )
        record = SessionRecord(tuple(step.messages), step.state, record.taken, record.withdrawn)
        if step.cut:
            self.store.save_all(turn.session, record, self.stats(turn.session))
            turn.unsaved = None
        else:
            turn.unsaved = record
        kwargs = self.keeper.work_kwargs(turn.session, record.window)
        messages = self._setups.render(turn.session, turn.setup, record.window)
        body = self._work_body(turn, messages, kwargs)
        self._as_openai(turn.session).keep(messages)
        return record, kwargs, messages, body

    def _after_call(
        self,
        turn: Turn,
        record: SessionRecord,
        done: Completion,
        number: int,
    ) -> SessionRecord | Answer:
        """In a worker thread: keep the reply; answer its searches (then the record to call
        again with) or finish (the answer)."""
        session, reply = turn.session, done.reply
        searching = turn.search_tool is not None
        if searching and turn.withheld:
            searching = False  # withheld from this call: its search calls are not answered
            reply = self.keeper.answer_only(session, reply)
        reply = self.keeper.record_reply(session, reply)
        searches = [c for c in reply.tool_calls if c["name"] == SEARCH_TOOL_NAME]
        broken = [c for c in reply.invalid_tool_calls if c["name"] == SEARCH_TOOL_NAME]
        own_calls = len(reply.tool_calls) + len(reply.invalid_tool_calls) > len(searches) + len(
            broken
        )
        answering = searching and bool(searches or broken) and number < self.max_upstream_calls
        final = own_calls or not answering  # the front door may have named the final reply
        named = turn.reply_id if final and turn.reply_id is not None else new_id()
        reply.id = named  # read for this call alone (or copied from it by the keeper): no copy
        if answering:
            results = answer_searches(self.keeper, session, reply)
            self.stats(session).search_rounds += 1
            if own_calls:  # the agent's calls go back to it; the results wait in view
                record = record.appended([reply, *results[1:]])
                return self._finish(turn, record, done, reply, True)
            record = record.appended(results)
            self.store.save_all(session, record, self.stats(session))
            turn.unsaved = None
            return record
        if searching and (searches or broken):
            self.stats(session).loop_limit_hits += 1
        return self._finish(turn, record, done, reply, False)

    async def _main_call(
        self,
        turn: Turn,
        kwargs: dict[str, Any],
        messages: list[BaseMessage],
        body: dict[str, Any],
    ) -> Completion:
        """A work call's completion. A reply that thought to its limit is asked again without
        thinking."""
        turn.carried += turn.streamed.get("content", "")
        turn.streamed, turn.streamed_logprobs = {}, {}
        turn.main_calls += 1
        done = await self._call(turn, body, True)
        retry = self.keeper.retry_kwargs(turn.session, kwargs, done.reply)
        if retry is not None:
            turn.carried += turn.streamed.get("content", "")
            turn.streamed, turn.streamed_logprobs = {}, {}
            turn.main_calls += 1
            body = self._work_body(turn, messages, retry)
            done = await self._call(turn, body, True)
        return done

    async def _call(self, turn: Turn, body: dict[str, Any], main: bool = False) -> Completion:
        forward: Callable[[StreamPiece], Awaitable[None]] | None = None
        if main and turn.forward is not None:
            sink = turn.forward

            async def forward_piece(piece: StreamPiece) -> None:
                for key, text in piece.delta.items():
                    turn.streamed[key] = turn.streamed.get(key, "") + text
                if isinstance(piece.logprobs, dict):
                    for name, entries in piece.logprobs.items():
                        if isinstance(entries, list):
                            sent = turn.streamed_logprobs.get(name, 0)
                            turn.streamed_logprobs[name] = sent + len(entries)
                if turn.context is not None:  # a Responses or Messages writer keeps calls apart
                    piece = replace(piece, call=turn.main_calls)
                await sink(piece)

            forward = forward_piece

        if turn.lease is not None:
            body = await turn.lease.prepare(body)
        headers = turn.context.headers if turn.context is not None else None
        done = await self.upstream.complete(
            body, auth=turn.auth, tally=turn.tally, forward=forward, headers=headers
        )
        if turn.lease is not None:
            turn.lease.observe(done.data)
        turn.add_usage(done.data)
        return done

    def _finish(
        self,
        turn: Turn,
        record: SessionRecord,
        done: Completion,
        reply: AIMessage,
        answered: bool,
    ) -> Answer:
        """Keep the final reply and give the agent exactly what it may see. ``answered``: the
        reply's searches were answered and their results follow it in ``record``'s window."""
        hide = SEARCH_TOOL_NAME if turn.search_tool is not None else None
        data = done.data
        message, reason = agent_reply(data, hide)
        visible = reply
        if hide is not None and any(
            c["name"] == hide for c in (*reply.tool_calls, *reply.invalid_tool_calls)
        ):
            visible = reply.model_copy(
                update={
                    "tool_calls": [c for c in reply.tool_calls if c["name"] != hide],
                    "invalid_tool_calls": [
                        c for c in reply.invalid_tool_calls if c["name"] != hide
                    ],
                }
            )
        # a streaming agent got earlier calls' text (carried) before this reply's
        digest = received_digest(done, message, turn.carried)
        window = record.window if answered else (*record.window, visible)
        self.quota.charge(turn.session, len(text_of(reply)), check=False)
        taken = (*record.taken, (digest, str(reply.id)))
        record = SessionRecord(window, record.keeper_state, taken, record.withdrawn)
        self.store.save_all(turn.session, record, turn.count_into(self.stats(turn.session)))
        turn.unsaved = None
        if not turn.carried and turn.resent is not None:  # the agent may send it back as is
            self._resent.answered(
                turn.session, turn.resent, message, (message_key(message), digest)
            )
        return Answer(
            data,
            message,
            reason,
            turn.summed_usage(),
            dict(turn.streamed),
            dict(turn.streamed_logprobs),
            call=turn.main_calls,
        )

    async def aclose(self) -> None:
        await self.upstream.aclose()
        if self.slots is not None:
            await self.slots.aclose()
        if self._pool is not None:
            self._pool.close()
        # closing waits for the background indexer to drain and closes the archive's files:
        # blocking work, so it runs in a thread and the loop keeps serving whoever is still on it
        await asyncio.to_thread(self.keeper.close)
