"""The keeper engine: pure decisions around an archive, driven by a model call it is given.

Each step, before the model is called:

1. new inputs get their item numbers; a new question gets the RULES placed right after it;
2. when the request is about to outgrow the window (or every N items), one more message is
   appended to the conversation the server has already read, asking for the changes; the reply
   is parsed, checked, re-asked within bounds, and applied to the NOTES;
3. the turns that leave the window are archived word for word in the same transaction as the
   new NOTES version, and the window restarts from the task, the NOTES and the newest exchange.

Adapters (the LangGraph node, the LangChain middleware, the proxy) only convert formats and call
:meth:`Keeper.step` or :meth:`Keeper.astep`; the two differ only in how the model is called.

This module holds the step's order and its I/O; each phase lives beside it:
:mod:`~keeper_middleware.arrivals` (taking new messages in), :mod:`~keeper_middleware.window`
(sizes, when and what to cut; pure), :mod:`~keeper_middleware.room` (sharing the room among
messages; pure), :mod:`~keeper_middleware.note_dialogue` (the note-taking conversation),
:mod:`~keeper_middleware.commit` (finishing a cut), :mod:`~keeper_middleware.oversized`
(messages archived whole, an excerpt in view), :mod:`~keeper_middleware.sessions` (per-session
values), :mod:`~keeper_middleware.branches` (what the branch a step runs on sees) and
:mod:`~keeper_middleware.search.searcher` (the search tool's body).

The keeper's memory is a function of the branch being run: the keeper state (the graph's
``keeper`` channel) names the branch's latest cut, and the NOTES, the archive's records, the
moved entries and the search guards are those of that branch (docs/branches.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage

from keeper_middleware.archive.records import TIP, ArchivedTurn, Head
from keeper_middleware.archive.store import ArchiveStore, open_archive
from keeper_middleware.arrivals import Arrivals
from keeper_middleware.branches import HEAD_KEY, Branches, state_head
from keeper_middleware.checks import NoteCheck, default_checks
from keeper_middleware.commit import CutCommit
from keeper_middleware.config import KeeperConfig
from keeper_middleware.counters import Counters
from keeper_middleware.cut import KEPT_KEY, recount_kept
from keeper_middleware.errors import ConfigurationError
from keeper_middleware.indexing import BackgroundIndexing
from keeper_middleware.items import ItemNumbering
from keeper_middleware.marks import verified
from keeper_middleware.messages import (
    close_unanswered_calls,
    strip_reasoning,
    with_storable_calls,
)
from keeper_middleware.model_setup import AsyncNoteCall, ModelSetup, NoteCall, Tool
from keeper_middleware.namespaces import archive_namespace, database_of
from keeper_middleware.note_dialogue import NoteDialogue
from keeper_middleware.notes import Notes
from keeper_middleware.oversized import OversizedMessages
from keeper_middleware.questions import (
    PatternQuestionDetector,
    QuestionDetector,
    open_question_index,
)
from keeper_middleware.retrievers.base import Hit, Retriever, search_within
from keeper_middleware.retrievers.factory import RetrieverSpec, make_retriever
from keeper_middleware.room import unkeep
from keeper_middleware.search.branch_guards import sample_now
from keeper_middleware.search.guards import GuardState
from keeper_middleware.search.searcher import KEEPER_CHANNEL, ArchiveSearch
from keeper_middleware.session_locks import SessionLockBackend, SessionLocks
from keeper_middleware.sessions import MOVED_ENTRIES, MOVED_KEYS, SessionState
from keeper_middleware.steps import Pending, StepResult
from keeper_middleware.thinking import call_kwargs, retry_of
from keeper_middleware.tokens import TokenCounter, resolve_token_counter
from keeper_middleware.window import NOTES_FRAME_TOKENS, WindowPolicy

__all__ = [
    "MOVED_ENTRIES",
    "MOVED_KEYS",
    "NOTES_FRAME_TOKENS",
    "AsyncNoteCall",
    "Keeper",
    "ModelSetup",
    "NoteCall",
    "StepResult",
    "Tool",
    "archive_namespace",
]

log = logging.getLogger("keeper_middleware")
"""One record per decision: a cut (INFO), a NOTES version (INFO), a re-ask (INFO), a refused
search (INFO), an oversized message (WARNING), the request size of every step (DEBUG)."""


class Keeper:
    """The engine. One instance serves many sessions (threads); all state is per session."""

    def __init__(
        self,
        config: KeeperConfig | None = None,
        *,
        archive: ArchiveStore | str | Path = ":memory:",
        retriever: RetrieverSpec = None,
        passages_retriever: RetrieverSpec = None,
        token_counter: TokenCounter | str | None = None,
        checks: Sequence[NoteCheck] | None = None,
        question_detector: QuestionDetector | None = None,
        namespace: str | None = None,
    ) -> None:
        """``retriever`` serves the archive search tool; ``passages_retriever`` (default: the
        same) serves the sentences shown next to new questions (``show_retrieved``), so the two
        can be swapped independently. ``namespace`` names the collection a retriever on a
        Chroma server (``"embedding+http://host:port"``) keeps this keeper's passages in; the
        default is one collection per archive file, so apps sharing a server never collide."""
        if config is not None and not isinstance(config, KeeperConfig):
            raise ConfigurationError(
                f"config={config!r} is a {type(config).__name__}, not a KeeperConfig; pass "
                "config=KeeperConfig(window=..., ...)"
                + (" (e.g. KeeperConfig(**your_dict))" if isinstance(config, Mapping) else "")
            )
        self.config = config or KeeperConfig()
        self.archive = open_archive(archive)
        index_dir = None
        database, schema = database_of(self.archive)
        if database is None and isinstance(archive, str | Path) and str(archive) != ":memory:":
            index_dir = Path(archive).with_suffix(".index")
        self.namespace = namespace or archive_namespace(self.archive if database else archive)
        self.retriever = make_retriever(
            retriever,
            path=index_dir,
            namespace=self.namespace,
            database=database,
            schema=schema,
            vectors_may_lag=True,
        )
        self.passages_retriever = (
            self.retriever
            if passages_retriever is None
            else make_retriever(
                passages_retriever,
                path=index_dir.with_suffix(".passages") if index_dir else None,
                namespace=f"{self.namespace}-passages",
                database=database,
                schema=schema,
                vectors_may_lag=True,
            )
        )
        shared = self.archive if isinstance(self.archive, SessionLockBackend) else None
        self.locks = SessionLocks(shared)
        self.tokens = resolve_token_counter(token_counter)
        self.checks = (
            tuple(checks)
            if checks is not None
            else default_checks(
                self.config.tracked_names, noted_names=self.config.track_noted_names
            )
        )
        self.detector = question_detector or PatternQuestionDetector(self.config.question_patterns)
        self.items = ItemNumbering(self.config.item_pattern, self.config.item_tools)
        self.sessions = SessionState(self.archive, self.locks)
        self.window = WindowPolicy(self.config, self.tokens, self.detector)
        self.dialogue = NoteDialogue(self.config, self.tokens, self.checks, self.detector)
        self.branches = Branches(self.archive, self._index_retrievers, self.config.passages)
        self.oversized = OversizedMessages(
            archive=self.archive,
            tokens=self.tokens,
            window=self.window,
            page_tokens=self.config.page_tokens,
            sync_index=lambda session: self._sync_index(session),
            branches=self.branches,
        )
        self.indexing = BackgroundIndexing(
            self.archive, self._index_retrievers, unit=self.config.passages
        )
        self.branches.index = self.indexing
        self.searcher = ArchiveSearch(
            sessions=self.sessions,
            retriever=self.retriever,
            config=self.config,
            tokens=self.tokens,
            branches=self.branches,
            is_new_input=self.items.is_new_input,
            index_ready=self.indexing.ready,
        )
        self.commit = CutCommit(
            config=self.config,
            tokens=self.tokens,
            window=self.window,
            sessions=self.sessions,
            archive=self.archive,
            excerpter=self.oversized.excerpter,
            sync_index=lambda session: self._sync_index(session),
            whole_of=self.oversized.whole_of,
        )
        self.arrivals = Arrivals(
            config=self.config,
            tokens=self.tokens,
            detector=self.detector,
            items=self.items,
            window=self.window,
            sessions=self.sessions,
            passages=self.passages_retriever,
            archive_whole=self.oversized.archive_whole,
            branches=self.branches,
            index_ready=self.indexing.ready,
        )
        self._lock = self.sessions.lock

    # ----------------------------------------------------------------- state and counters

    @contextmanager
    def session(self, session: str) -> Iterator[None]:
        """Hold a session: its steps, searches and counters run one at a time, across every
        thread, task and (on a shared store) process. Re-entrant within one flow of control."""
        with self.sessions.hold(session):
            yield

    @asynccontextmanager
    async def asession(self, session: str) -> AsyncIterator[None]:
        """:meth:`session` for asyncio: waiting never blocks the event loop."""
        async with self.sessions.ahold(session):
            yield

    def counters(self, session: str) -> Counters:
        """The session's counters (calls, cuts, searches, tokens)."""
        return self.sessions.counters(session)

    def notes(self, session: str, *, head: Head = TIP) -> Notes:
        """The NOTES of a session at the cut ``head`` (default: its latest cut; a branch's head
        is :meth:`head_of` its graph state). Empty before the first cut."""
        return self.sessions.notes(session, head)

    def head_of(self, session: str, values: Mapping[str, Any] | None) -> str | None:
        """The latest cut of the branch a graph state is on (``agent.get_state(config).values``
        or a ``StateSnapshot``'s values): what :meth:`notes`, :meth:`turns` and :meth:`search`
        take as ``head=`` to read that branch's memory."""
        values = values or {}
        kstate = values.get(KEEPER_CHANNEL)
        messages = values.get("messages") or []
        return self.branches.head(
            session, kstate if isinstance(kstate, Mapping) else None, messages
        )

    def turns(self, session: str, *, head: Head = TIP) -> Iterator[ArchivedTurn]:
        """The archived turns the branch ``head`` sees, in order (default: the session's latest
        cut's branch; :meth:`head_of` a graph state names a branch)."""
        return self.archive.turns(session, within=self.branches.chain(session, head))

    def _guard(self, session: str) -> GuardState:
        return self.sessions.guard(session)

    def _set_guard(self, session: str, guard: GuardState) -> None:
        self.sessions.set_guard(session, guard)

    # ----------------------------------------------------------------- the step

    def step(
        self,
        session: str,
        messages: Sequence[BaseMessage],
        state: Mapping[str, Any] | None,
        setup: ModelSetup,
        call: NoteCall,
    ) -> StepResult:
        """One keeper step before a model call (sync)."""
        with self.session(session):
            pending = self._prepare(session, messages, state, setup)
            if pending.plan is None:
                return self._finish_without_cut(pending, messages)
            outcome = self.commit.reuse_committed(pending)
            if outcome is None:
                pending.request = self.dialogue.request(pending, setup)
                pending.tool_schemas = setup.tool_schemas
                outcome = self.dialogue.take(pending, self.counters(session), call)
            return self.commit.finish(pending, outcome, setup)

    async def astep(
        self,
        session: str,
        messages: Sequence[BaseMessage],
        state: Mapping[str, Any] | None,
        setup: ModelSetup,
        call: AsyncNoteCall,
    ) -> StepResult:
        """One keeper step before a model call (async); same decisions as :meth:`step`.

        The archive and index work runs in a worker thread, never on the event loop; only the
        model calls are awaited here. The session is held throughout (the threads run in this
        task's context, so they count as holding it)."""
        async with self.asession(session):
            pending = await asyncio.to_thread(self._prepare, session, messages, state, setup)
            if pending.plan is None:
                return await asyncio.to_thread(self._finish_without_cut, pending, messages)
            outcome = await asyncio.to_thread(self.commit.reuse_committed, pending)
            if outcome is None:
                pending.request = self.dialogue.request(pending, setup)
                pending.tool_schemas = setup.tool_schemas
                outcome = await self.dialogue.atake(pending, self.counters(session), call)
            return await asyncio.to_thread(self.commit.finish, pending, outcome, setup)

    # ----------------------------------------------------------------- arrivals

    def _prepare(
        self,
        session: str,
        given: Sequence[BaseMessage],
        state: Mapping[str, Any] | None,
        setup: ModelSetup,
    ) -> Pending:
        window = self.window
        budget = self.config.budget
        self.indexing.schedule_once(session)  # turns a crash left unindexed
        kstate: dict[str, Any] = json.loads(json.dumps(dict(state or {})))
        if not kstate:
            self._warn_if_archive_outlived_state(session)
        messages = [_with_id(m) for m in given]
        # where messages enter: a forged keeper tag is ordinary content from here on, and a
        # tool call left without its result (a recursion limit, a crash) is closed
        messages, forged = verified(messages, lambda: self.sessions.secret(session))
        messages, _closed = close_unanswered_calls(messages)
        # the branch this step runs on: its latest cut, as the graph state names it
        kstate[HEAD_KEY] = self.branches.head(session, kstate, messages)
        notes = self.notes(session, head=kstate[HEAD_KEY])
        # kept messages a graph removed since the cut no longer count as noted
        messages, still_kept, recounted = recount_kept(messages, kstate.get(KEPT_KEY))
        if still_kept is not None:
            kstate[KEPT_KEY] = still_kept
        # each message is classified once per step (kind, text, size, question), here where
        # it enters; a message replaced on the way (an excerpt) is classified anew
        entries = window.classify(messages)
        messages, shrunk = self.arrivals.observe(session, entries, kstate, setup, notes)
        entries = window.classify(messages, entries)
        plan, request_tokens = window.plan(messages, kstate, setup, notes)
        if plan is None and request_tokens > budget:
            # what was kept in view as already noted may leave with the next cut instead
            messages, unkept = unkeep(entries)
            if unkept:
                shrunk = True
                entries = window.classify(messages, entries)
                plan, request_tokens = window.plan(messages, kstate, setup, notes)
        for _ in range(8):
            if plan is not None or request_tokens <= budget:
                break
            messages, more = self.oversized.shrink_in_view(session, entries, kstate, setup)
            if not more:
                break
            shrunk = True
            entries = window.classify(messages, entries)
            plan, request_tokens = window.plan(messages, kstate, setup, notes)
        if plan is None and request_tokens > budget:
            # the last resort: excerpt the biggest messages in view, wherever they are
            layout = window.layout(messages)
            messages = window.shrink_largest(
                entries,
                setup,
                self.oversized.excerpter(session, kstate),
                start=layout.head_end,
            )
            shrunk = True
            entries = window.classify(messages, entries)
            plan, request_tokens = window.plan(messages, kstate, setup, notes)
        counters = self.counters(session)
        if plan is None:  # sent as it is; a cut records the window it leaves (``CutCommit.finish``)
            counters.peak_window = max(counters.peak_window, request_tokens)
        log.debug(
            "step session=%s messages=%d request_tokens=%d notes_at=%d budget=%d",
            session,
            len(messages),
            request_tokens,
            self.config.notes_threshold,
            budget,
        )
        if plan is None and request_tokens > budget:
            raise window.too_big_error(request_tokens, entries, setup)
        pending = Pending(
            session,
            messages,
            kstate,
            plan,
            notes,
            replaced=bool(forged or shrunk or recounted),
            entries=entries,
        )
        if plan is not None and self.config.notes_mode == "in_place":
            # only the moved entries the noted turns may name are read, not every one ever moved
            noted = self.dialogue.noted_text(pending)
            chain = self.branches.chain(session, state_head(kstate))
            pending.moved_entries = self.sessions.moved_named(session, noted, chain)
            pending.archived_keys = self.sessions.archived_keys(
                session, self.dialogue.named_names(noted), chain
            )
        return pending

    def _warn_if_archive_outlived_state(self, session: str) -> None:
        archived = self.archive.turn_count(session)
        if archived:
            log.warning(
                "session=%s starts afresh but its archive already holds %d turns, which this "
                "new start does not see: the graph state was lost (an in-memory checkpointer "
                "with a file archive?). Pair the archive with a persistent checkpointer "
                "(SqliteSaver), or use a new thread id",
                session,
                archived,
            )

    # ----------------------------------------------------------------- finishing

    def _finish_without_cut(self, pending: Pending, given: Sequence[BaseMessage]) -> StepResult:
        self.sessions.save_counters(pending.session)
        given_ids = [m.id for m in given]
        ids = [m.id for m in pending.messages]
        changed = ids != given_ids or pending.replaced
        rewritten = changed and (ids[: len(given_ids)] != given_ids or pending.replaced)
        return StepResult(pending.messages, pending.state, changed, rewritten)

    def _sync_index(self, session: str) -> None:
        """Index archived turns the retrievers have not seen yet, in the background: the step
        does not wait for embeddings, and a search of the session waits only for its own."""
        self.indexing.schedule(session)

    def _index_retrievers(self) -> tuple[Retriever, ...]:
        if self.passages_retriever is not self.retriever:
            return (self.retriever, self.passages_retriever)
        return (self.retriever,)

    # ----------------------------------------------------------------- the model's side

    def work_kwargs(self, session: str, messages: Sequence[BaseMessage]) -> dict[str, Any]:
        """Call kwargs for the agent's own next model call.

        Thinking stays on while a question is open (without it a measured run repeated one
        search 790 times); the one reply after a stop line is sampled with some randomness.
        """
        layout = self.window.layout(messages)
        open_at = open_question_index(messages, self.detector, start=layout.head_end)
        kwargs = call_kwargs(self.config.thinking, thinking=open_at is not None)
        carried = sample_now(messages)  # the branch's own search results say, in a graph
        if carried is not None:
            if carried:
                kwargs.update(self.config.thinking.sample_after_stop)
            return kwargs
        with self.session(session):
            guard = self._guard(session)
            if guard.sample_next:
                kwargs.update(self.config.thinking.sample_after_stop)
                self._set_guard(session, replace(guard, sample_next=False))
        return kwargs

    def record_reply(self, session: str, reply: AIMessage) -> AIMessage:
        """Count a work reply and strip its reasoning before it is stored."""
        with self.session(session):
            counters = self.counters(session)
            counters.model_calls += 1
            counters.add_usage(reply, management=False)
            self.sessions.save_counters(session)
        return with_storable_calls(strip_reasoning(reply))

    def retry_kwargs(
        self, session: str, kwargs: Mapping[str, Any], reply: BaseMessage
    ) -> dict[str, Any] | None:
        """Whether a work reply is asked again, and with which call kwargs (None: it stands).

        A reply that thought to its limit and wrote nothing is asked again without thinking; an
        empty reply once more with some randomness, so it can come out different. Every adapter
        (node, middleware, proxy) asks here, so they retry alike.
        """
        decided = retry_of(self.config.thinking, kwargs, reply)
        if decided is None:
            return None
        counter, again = decided
        self._count_retry(session, counter)
        return again

    def _count_retry(self, session: str, field: str) -> None:
        with self.session(session):
            counters = self.counters(session)
            setattr(counters, field, getattr(counters, field) + 1)
            self.sessions.save_counters(session)

    def search(
        self,
        session: str,
        query: object = None,
        from_item: object = None,
        to_item: object = None,
        *,
        read: object = None,
        page: object = None,
        head: Head = TIP,
    ) -> str:
        """The archive search tool's body, guards included; see :meth:`run_search_tool`.
        ``head``: the branch to search (:meth:`head_of` a graph state; default: the session's
        latest cut's)."""
        args = {"query": query, "from_item": from_item, "to_item": to_item}
        if read is not None:
            args.update(read=read, page=page)
        return self.run_search_tool(session, args, head=head)

    def run_search_tool(self, session: str, args: object, *, head: Head = TIP) -> str:
        """Answer one ``search_archive`` call from the model's raw arguments, with the
        session's own guards (the proxy, a tool called outside a graph).

        Never raises for anything the model can send: bad arguments get a "Refused: …" text
        (:func:`~keeper_middleware.search.args.parse_search_args`). The guards' state is read,
        decided and written under one lock, so parallel searches cannot race past them. The
        reply is sized to the room a message has in view.
        """
        return self.searcher.run(session, args, head=head)[0]

    def answer_search(
        self, session: str, args: object, *, state: Mapping[str, Any], call_id: str
    ) -> tuple[str, dict[str, Any] | None]:
        """Answer the ``search_archive`` call ``call_id`` of a graph whose state is ``state``:
        on that state's branch, with the guards' state its messages carry. Returns the reply
        and the result's artifact (the guards' state after the search, for the next one). A
        state without a keeper step's values (a graph that archives by itself) searches the
        session as of its latest cut, with the session's own guards."""
        return self.searcher.answer(session, args, state=state, call_id=call_id)

    def retrieve(self, session: str, query: str, *, k: int = 10, head: Head = TIP) -> list[Hit]:
        """The archive's best matches for ``query`` on the branch ``head``, as the search
        tool finds them (without its guards or its rendering)."""
        self.indexing.ready(session)
        return search_within(
            self.retriever,
            query,
            session=session,
            k=k,
            within=self.branches.passages(session, head),
        )

    def forget(self, session: str) -> None:
        """Erase a session everywhere the keeper keeps it: archive, NOTES, values, indexes."""
        with self.session(session), self._lock:
            self.indexing.forget(session)
            self.archive.delete_session(session)
            self.retriever.delete_session(session)
            if self.passages_retriever is not self.retriever:
                self.passages_retriever.delete_session(session)
            self.sessions.drop(session)
            self.branches.forget(session)

    def close(self) -> None:
        """Index what is still queued, then close the indexes and the archive."""
        self.indexing.drain()
        if self.passages_retriever is not self.retriever:
            self.passages_retriever.close()
        self.retriever.close()
        self.archive.close()


def _with_id(message: BaseMessage) -> BaseMessage:
    if message.id:
        return message
    return message.model_copy(update={"id": str(uuid.uuid4())})
