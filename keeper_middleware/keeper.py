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

This module holds the step's order and its I/O; how a step takes its messages in is
:mod:`~keeper_middleware.step.preparing`, what the adapters ask around the agent's own model calls
is :mod:`~keeper_middleware.work_calls` (both mixed into :class:`Keeper`); each phase lives beside
it: :mod:`~keeper_middleware.step.arrivals` (taking new messages in), :mod:`~keeper_middleware.step.decide`
(the cut a window needs, what is in view fitted first), :mod:`~keeper_middleware.step.window`
(sizes, when and what to cut; pure), :mod:`~keeper_middleware.step.room` (sharing the room among
messages; pure), :mod:`~keeper_middleware.notes.dialogue` (the note-taking conversation),
:mod:`~keeper_middleware.step.commit` (finishing a cut), :mod:`~keeper_middleware.step.oversized`
(messages archived whole, an excerpt in view), :mod:`~keeper_middleware.sessions.state` (per-session
values), :mod:`~keeper_middleware.sessions.branches` (what the branch a step runs on sees) and
:mod:`~keeper_middleware.search.searcher` (the search tool's body).

The keeper's memory is a function of the branch being run: the keeper state (the graph's
``keeper`` channel) names the branch's latest cut, and the NOTES, the archive's records, the
moved entries and the search guards are those of that branch (docs/branches.md).
"""

from __future__ import annotations

import asyncio
import logging
import operator
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage

from keeper_middleware import phases
from keeper_middleware.archive.records import TIP, ArchivedTurn, Head
from keeper_middleware.archive.store import ArchiveStore, open_archive
from keeper_middleware.config import KeeperConfig
from keeper_middleware.errors import ConfigurationError
from keeper_middleware.model.setup import AsyncNoteCall, ModelSetup, NoteCall, Tool
from keeper_middleware.notes.block import Notes
from keeper_middleware.notes.checks import NoteCheck, default_checks
from keeper_middleware.notes.dialogue import NoteDialogue
from keeper_middleware.phases import PhaseListener, checked_listener, span
from keeper_middleware.reinjection.questions import (
    PatternQuestionDetector,
    QuestionDetector,
)
from keeper_middleware.retrievers.factory import RetrieverSpec, make_retriever
from keeper_middleware.search.guards import GuardState
from keeper_middleware.search.indexing import BackgroundIndexing
from keeper_middleware.search.namespaces import archive_namespace, database_of
from keeper_middleware.search.searcher import KEEPER_CHANNEL, ArchiveSearch
from keeper_middleware.sessions.branches import (
    Branches,
)
from keeper_middleware.sessions.copies import ThreadCopies
from keeper_middleware.sessions.counters import Counters
from keeper_middleware.sessions.locks import SessionLockBackend, SessionLocks
from keeper_middleware.sessions.starts import StartWarnings
from keeper_middleware.sessions.state import MOVED_ENTRIES, MOVED_KEYS, SessionState
from keeper_middleware.step.appended import Tails
from keeper_middleware.step.arrivals import Arrivals
from keeper_middleware.step.commit import CutCommit
from keeper_middleware.step.decide import Decisions
from keeper_middleware.step.items import ItemNumbering
from keeper_middleware.step.known import LastEntries
from keeper_middleware.step.oversized import OversizedMessages
from keeper_middleware.step.preparing import Preparing
from keeper_middleware.step.result import StepResult
from keeper_middleware.step.window import NOTES_FRAME_TOKENS, WindowPolicy
from keeper_middleware.tokens.counting import TokenCounter, resolve_token_counter
from keeper_middleware.work_calls import WorkCalls

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

_ID = operator.attrgetter("id")

log = logging.getLogger(__name__)
"""One record per decision: a cut (INFO), a NOTES version (INFO), a re-ask (INFO), a refused
search (INFO), an oversized message (WARNING); the request size of every step (DEBUG) is
:mod:`~keeper_middleware.step.decide`'s."""


class Keeper(Preparing, WorkCalls):
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
        phase_listener: PhaseListener | None = None,
        unchanged_in_place: bool = False,
    ) -> None:
        """``retriever`` serves the archive search tool; ``passages_retriever`` (default: the
        same) serves the sentences shown next to new questions (``show_retrieved``), so the two
        can be swapped independently. ``namespace`` names the collection a retriever on a
        Chroma server (``"embedding+http://host:port"``) keeps this keeper's passages in; the
        default is one collection per archive file, so apps sharing a server never collide.

        Args:
            config: the window, budgets and cadence (:class:`KeeperConfig`); its defaults
                when ``None``.
            archive: an :class:`ArchiveStore`, a SQLite file path, a ``postgresql://`` URL,
                or ``":memory:"``.
            retriever: what answers the search tool: ``"keyword"``, ``"embedding"``,
                ``"hybrid"`` (with ``+http://host:port`` for a Chroma server), or a retriever.
            passages_retriever: what finds the passages shown next to new questions; the
                ``retriever`` when ``None``.
            token_counter: how tokens are counted: a :class:`TokenCounter`, a tokenizer name,
                a function from messages to a count, or a chat model.
            checks: the checks a NOTES change must pass; the default checks when ``None``.
            question_detector: what marks a message as a question that gets the RULES
                repeated beside it; the default detector when ``None``.
            namespace: the Chroma collection this keeper's passages live in on a shared
                server.
            phase_listener: hears when each phase of a step or a search starts and ends
                (:mod:`keeper_middleware.phases`), for tracing; also settable later as
                ``keeper.phase_listener``.
            unchanged_in_place: the caller never changes a message in place once a step has
                seen it (a changed message is always a new object, as keeper-proxy makes
                them): a step that appends then trusts the very same objects to be the very
                same messages, instead of comparing each one's fields with a copy
                (:mod:`~keeper_middleware.step.known`). Leave it off for LangChain and
                LangGraph callers, which may change a message in place.

        Raises:
            ConfigurationError: a ``config`` that is not a :class:`KeeperConfig`, or a
                retriever or token counter it cannot build.
            ArgumentTypeError: an ``archive`` of a type it cannot open, or a
                ``phase_listener`` without the listener's two methods.
            ArchiveError: an archive that cannot be opened or is damaged.
        """
        if config is not None and not isinstance(config, KeeperConfig):
            raise ConfigurationError(
                f"config={config!r} is a {type(config).__name__}, not a KeeperConfig; pass "
                "config=KeeperConfig(window=..., ...)"
                + (" (e.g. KeeperConfig(**your_dict))" if isinstance(config, Mapping) else "")
            )
        self.config = config or KeeperConfig()
        self.phase_listener = checked_listener(phase_listener)
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
            keyword_engine=self.config.keyword_engine,
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
                keyword_engine=self.config.keyword_engine,
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
        self.items = ItemNumbering(
            self.config.item_pattern, self.config.item_tools, learn=self.config.learn_item_heads
        )
        self.sessions = SessionState(self.archive, self.locks)
        self.starts = StartWarnings(self.archive)
        self.window = WindowPolicy(
            self.config, self.tokens, self.detector, unchanged_in_place=unchanged_in_place
        )
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
        self.decisions = Decisions(
            config=self.config,
            window=self.window,
            oversized=self.oversized,
            dialogue=self.dialogue,
            sessions=self.sessions,
            branches=self.branches,
        )
        """The step's decision once its messages are taken in (:mod:`~keeper_middleware.step.decide`)."""
        self.arrivals = Arrivals(
            config=self.config,
            tokens=self.tokens,
            detector=self.detector,
            items=self.items,
            window=self.window,
            sessions=self.sessions,
            passages=self.passages_retriever,
            archive_whole=self.oversized.archive_whole,
            fold_round=self.oversized.fold_round,
            branches=self.branches,
            index_ready=self.indexing.ready,
        )
        self._lock = self.sessions.lock
        self.last_entries = LastEntries(unchanged_in_place=unchanged_in_place)
        """Each session's entries as its last step ended, so a step classifies only what is new."""
        self.tails = Tails(
            window=self.window,
            detector=self.detector,
            pinned_head=self.config.pinned_head,
            secret=self.sessions.secret,
            last=self.last_entries,
        )
        """When a step may start from what its session's last step found in its window."""
        self.copies = ThreadCopies(self.archive, self.sessions.secret)
        """Threads copied from another thread's state, by the archive session they go on in."""
        self._indexes_checked: set[str] = set()
        self._states_checked: set[str] = set()

    # ----------------------------------------------------------------- state and counters

    def session(self, session: str) -> AbstractContextManager[None]:
        """Hold a session: its steps, searches and counters run one at a time, across every
        thread, task and (on a shared store) process. Re-entrant within one flow of control."""
        return self.sessions.hold(session)

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
        return self.sessions.notes(self.copies.of(session), head)

    def archived_as(
        self,
        session: str,
        state: Mapping[str, Any] | None,
        messages: Sequence[BaseMessage] = (),
    ) -> str:
        """The archive session a thread's keeper state belongs to: the thread's own, or, for a
        thread copied from another (``update_state`` on a new thread id with another thread's
        values), the one it was copied from, where it goes on as a branch of its own
        (:mod:`~keeper_middleware.sessions.copies`)."""
        return self.copies.archived_as(session, state, messages)

    def head_of(self, session: str, values: Mapping[str, Any] | None) -> str | None:
        """The latest cut of the branch a graph state is on (``agent.get_state(config).values``
        or a ``StateSnapshot``'s values): what :meth:`notes`, :meth:`turns` and :meth:`search`
        take as ``head=`` to read that branch's memory."""
        values = values or {}
        kstate = values.get(KEEPER_CHANNEL)
        messages = values.get("messages") or []
        kstate = kstate if isinstance(kstate, Mapping) else None
        return self.branches.head(self.archived_as(session, kstate, messages), kstate, messages)

    def turns(self, session: str, *, head: Head = TIP) -> Iterator[ArchivedTurn]:
        """The archived turns the branch ``head`` sees, in order (default: the session's latest
        cut's branch; :meth:`head_of` a graph state names a branch)."""
        session = self.copies.of(session)
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
        """One keeper step before a model call (sync): as many cuts as the window needs."""
        self.starts.sync_step(session)
        session = self.archived_as(session, state, messages)
        with self.session(session), self._span("step", session):
            with self._span("prepare", session):
                pending = self._prepare(session, messages, state, setup)
            cuts = 0
            while pending.plan is not None:
                outcome = self.commit.reuse_committed(pending)
                if outcome is None:
                    with self._span("note_request", session):
                        pending.request = self.dialogue.request(pending, setup)
                        pending.tool_schemas = setup.tool_schemas
                        outcome = self.dialogue.take(
                            pending, self.counters(session), self._spanned_call(call, session)
                        )
                with self._span("commit", session):
                    result = self.commit.finish(pending, outcome, setup)
                cuts += 1
                if pending.backlog is None:
                    return result
                pending = self._next_part(pending, result, setup)
            return self._finish_without_cut(pending, messages, setup, cuts)

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
        session = await asyncio.to_thread(self.archived_as, session, state, messages)
        async with self.asession(session):
            with self._span("step", session):
                return await self._astep(session, messages, state, setup, call)

    async def _astep(
        self,
        session: str,
        messages: Sequence[BaseMessage],
        state: Mapping[str, Any] | None,
        setup: ModelSetup,
        call: AsyncNoteCall,
    ) -> StepResult:
        with self._span("prepare", session):
            pending = await asyncio.to_thread(self._prepare, session, messages, state, setup)
        cuts = 0
        while pending.plan is not None:
            outcome = await asyncio.to_thread(self.commit.reuse_committed, pending)
            if outcome is None:
                with self._span("note_request", session):
                    pending.request = self.dialogue.request(pending, setup)
                    pending.tool_schemas = setup.tool_schemas
                    outcome = await self.dialogue.atake(
                        pending, self.counters(session), self._spanned_acall(call, session)
                    )
            with self._span("commit", session):
                result = await asyncio.to_thread(self.commit.finish, pending, outcome, setup)
            cuts += 1
            if pending.backlog is None:
                return result
            pending = await asyncio.to_thread(self._next_part, pending, result, setup)
        return await asyncio.to_thread(self._finish_without_cut, pending, messages, setup, cuts)

    def _span(self, phase: str, session: str) -> AbstractContextManager[None]:
        return span(self.phase_listener, phase, session)

    def _spanned_call(self, call: NoteCall, session: str) -> NoteCall:
        """``call`` inside a ``note_call`` span (``call`` itself when nothing listens)."""
        if self.phase_listener is None and not phases.listened():
            return call

        def spanned(*request: Any) -> AIMessage:
            with self._span("note_call", session):
                return call(*request)

        return spanned

    def _spanned_acall(self, call: AsyncNoteCall, session: str) -> AsyncNoteCall:
        if self.phase_listener is None and not phases.listened():
            return call

        async def spanned(*request: Any) -> AIMessage:
            with self._span("note_call", session):
                return await call(*request)

        return spanned

    def forget(self, session: str) -> None:
        """Erase a session everywhere the keeper keeps it: archive, NOTES, values, indexes."""
        with self.session(session), self._lock:
            self.indexing.forget(session)
            self.archive.delete_session(session)
            self.retriever.delete_session(session)
            if self.passages_retriever is not self.retriever:
                self.passages_retriever.delete_session(session)
            self.sessions.drop(session)
            self.last_entries.forget(session)
            self.branches.forget(session)
            self._indexes_checked.discard(session)
            self._states_checked.discard(session)

    def close(self) -> None:
        """Index what is still queued, then close the indexes and the archive."""
        self.indexing.drain()
        if self.passages_retriever is not self.retriever:
            self.passages_retriever.close()
        self.retriever.close()
        self.archive.close()
