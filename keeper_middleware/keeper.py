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
:mod:`~keeper_middleware.step.arrivals` (taking new messages in), :mod:`~keeper_middleware.step.decide`
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
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage

from keeper_middleware import phases
from keeper_middleware.archive.records import TIP, ArchivedTurn, Head
from keeper_middleware.archive.store import ArchiveStore, open_archive
from keeper_middleware.config import KeeperConfig
from keeper_middleware.errors import ArchiveError, ConfigurationError, UnknownSessionError
from keeper_middleware.messages.facts import (
    close_unanswered_calls,
    keeper_kind,
    strip_reasoning,
    with_storable_calls,
)
from keeper_middleware.messages.marks import verified
from keeper_middleware.model.setup import AsyncNoteCall, ModelSetup, NoteCall, Tool
from keeper_middleware.model.thinking import call_kwargs, retry_of
from keeper_middleware.notes.block import Notes
from keeper_middleware.notes.checks import NoteCheck, default_checks
from keeper_middleware.notes.dialogue import NoteDialogue
from keeper_middleware.phases import PhaseListener, checked_listener, span
from keeper_middleware.reinjection.questions import (
    PatternQuestionDetector,
    QuestionDetector,
    open_question_index,
)
from keeper_middleware.retrievers.background import background_worker
from keeper_middleware.retrievers.base import Hit, Retriever, search_within
from keeper_middleware.retrievers.factory import RetrieverSpec, make_retriever
from keeper_middleware.search.branch_guards import sample_now, withheld_now
from keeper_middleware.search.guards import GuardState, without_search_calls
from keeper_middleware.search.indexing import BackgroundIndexing, reconcile
from keeper_middleware.search.namespaces import archive_namespace, database_of
from keeper_middleware.search.run_steps import room_for_a_search
from keeper_middleware.search.searcher import KEEPER_CHANNEL, ArchiveSearch
from keeper_middleware.sessions.branches import (
    ARCHIVE_SESSION_KEY,
    HEAD_KEY,
    Branches,
    state_head,
)
from keeper_middleware.sessions.copies import ThreadCopies
from keeper_middleware.sessions.counters import Counters
from keeper_middleware.sessions.json_copy import json_copy
from keeper_middleware.sessions.locks import SessionLockBackend, SessionLocks
from keeper_middleware.sessions.starts import StartWarnings
from keeper_middleware.sessions.state import MOVED_ENTRIES, MOVED_KEYS, SessionState
from keeper_middleware.step.appended import Tails
from keeper_middleware.step.arrivals import Arrivals
from keeper_middleware.step.backlog import (
    part_state,
    split_backlog,
)
from keeper_middleware.step.commit import CutCommit
from keeper_middleware.step.cut import KEPT_KEY, recount_kept, uncount_removed
from keeper_middleware.step.decide import Decisions
from keeper_middleware.step.entries import Entry, first_fresh, messages_of
from keeper_middleware.step.handed_back import as_left, window_of
from keeper_middleware.step.items import ITEMS_SINCE_NOTES, ItemNumbering
from keeper_middleware.step.known import LastEntries
from keeper_middleware.step.oversized import OversizedMessages
from keeper_middleware.step.result import Pending, StepResult
from keeper_middleware.step.tail import Appending, WindowFacts
from keeper_middleware.step.window import NOTES_FRAME_TOKENS, WindowPolicy
from keeper_middleware.tokens.counting import TokenCounter, resolve_token_counter

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

    # ----------------------------------------------------------------- arrivals

    def _prepare(
        self,
        session: str,
        given: Sequence[BaseMessage],
        state: Mapping[str, Any] | None,
        setup: ModelSetup,
    ) -> Pending:
        appended = self._appended(session, given, state, setup)
        if appended is not None:
            return appended
        kstate: dict[str, Any] = json_copy(dict(state or {}))
        fresh = not kstate
        kstate[ARCHIVE_SESSION_KEY] = session  # a copy of this state carries it to its thread
        if not fresh:
            self._check_archive_holds(session, kstate)
        self._check_index(session)  # before passages are shown beside a question
        self.indexing.schedule_once(session)  # turns a crash left unindexed
        messages = list(given) if all(map(_ID, given)) else [_with_id(m) for m in given]
        # where messages enter: a forged keeper tag is ordinary content from here on, and a
        # tool call left without its result (a recursion limit, a crash) is closed
        messages, forged = verified(messages, lambda: self.sessions.secret(session))
        messages, _closed = close_unanswered_calls(messages)
        # a state that names no branch, or a parent graph whose own keeper channel comes back
        # while its messages keep all the agent ever returned (add_messages merges by id)
        if HEAD_KEY not in kstate or not as_left(messages, pinned_head=self.config.pinned_head):
            messages = self._handed_back(session, messages)
        # the branch this step runs on: its latest cut, as the graph state names it
        kstate[HEAD_KEY] = self.branches.head(session, kstate, messages)
        if fresh:  # no state: afresh, unless NOTES in view name a branch (a parent handed back)
            self.starts.fresh_state(session, names_branch=kstate[HEAD_KEY] is not None)
        notes = self.notes(session, head=kstate[HEAD_KEY])
        # inputs a graph removed before a cut noted them no longer count toward the next one
        uncount_removed(kstate, messages, ITEMS_SINCE_NOTES)
        # kept messages a graph removed since the cut no longer count as noted
        messages, still_kept, recounted = recount_kept(messages, kstate.get(KEPT_KEY))
        if still_kept is not None:
            kstate[KEPT_KEY] = still_kept
        # each message is classified once per step (kind, text, size, question), here where
        # it enters; a message replaced on the way (an excerpt) is classified anew
        entries = self.last_entries.classify(session, messages, self.window.classify)
        messages, shrunk = self.arrivals.observe(session, entries, kstate, setup, notes)
        entries = self.window.classify(messages, entries)
        replaced = bool(forged or shrunk or recounted)
        return self._after_arrivals(session, entries, kstate, setup, notes, replaced)

    def _after_arrivals(
        self,
        session: str,
        entries: list[Entry],
        kstate: dict[str, Any],
        setup: ModelSetup,
        notes: Notes,
        replaced: bool,
        facts: WindowFacts | None = None,
        messages: list[BaseMessage] | None = None,
    ) -> Pending:
        """The step's decision once its messages are taken in (``facts``: what the
        whole-window passes give for ``entries``, when known; ``messages``: theirs)."""
        backlog = split_backlog(self.window, entries, setup, facts)
        if backlog is not None:
            # more than one note request can carry: note it in parts, a cut each
            entries = entries[: backlog.start]
            kstate = part_state(kstate, backlog)
            facts = messages = None
        if messages is None:
            messages = messages_of(entries)
        return self.decisions.decide(
            session, messages, entries, kstate, setup, notes, replaced, backlog, facts
        )

    def _appended(
        self,
        session: str,
        given: Sequence[BaseMessage],
        state: Mapping[str, Any] | None,
        setup: ModelSetup,
    ) -> Pending | None:
        """:meth:`_prepare` of a step that only appends to the window its session's last step
        ended with, given back the state it handed back (None: any other step). Each pass
        starts from what it found in that window (:mod:`~keeper_middleware.step.tail`), so the
        step costs what the new messages cost, not what the window holds; the decisions are
        those of the full path."""
        taken = self.tails.take(session, given, state)
        if taken is None:
            return None
        known, tail = taken
        count = len(known.messages)
        # the tail's copy of the state is private and left behind by this step: its values
        # are this step's to replace (``Tails.left`` copies the state the step hands back)
        kstate: dict[str, Any] = dict(tail.state)
        kstate[HEAD_KEY] = self.branches.head(session, kstate, given)
        self._check_archive_holds(session, kstate)
        self._check_index(session)
        self.indexing.schedule_once(session)
        notes = self.notes(session, head=kstate[HEAD_KEY])
        added = self.window.classify(given[count:])
        entries = known.entries  # taken out: this step's to extend (``LastEntries.appended``)
        entries.extend(added)
        facts = tail.facts.extended(added, self.detector)
        if facts is None:  # never: appendable turns NOTES away; the full path walks all
            self.last_entries.forget(session)
            return None
        first = count + first_fresh(added, tail.ids)
        appending = Appending(facts, count, known.messages, tail.ids, first)
        messages, shrunk = self.arrivals.observe(session, entries, kstate, setup, notes, appending)
        if shrunk or not appending.whole:
            entries = self.window.classify(messages, entries)
            return self._after_arrivals(session, entries, kstate, setup, notes, shrunk)
        if len(messages) != len(given) or not all(
            map(operator.is_, messages[count:], given[count:])
        ):  # something was placed beside a new question
            added = self.window.classify(messages[count:], added)
            del entries[count:]
            entries.extend(added)
            facts = tail.facts.extended(added, self.detector)
        pending = self._after_arrivals(
            session, entries, kstate, setup, notes, False, facts, messages
        )
        if facts is not None and pending.plan is None and pending.backlog is None:
            pending.facts, pending.appending, pending.before = facts, appending, known
        return pending

    def _handed_back(self, session: str, messages: list[BaseMessage]) -> list[BaseMessage]:
        """A state that names no branch (its keeper channel stayed behind: a subgraph node of
        a parent graph, a graph without a checkpointer) may hand back a history holding the
        keeper's earlier NOTES and RULES and turns already archived: brought back to the window
        the keeper last left (``step.handed_back``), never stacked nor noted twice."""
        newest = self.branches.newest_notes(session, messages)
        if newest is None:
            return messages
        ids = [str(m.id) for m in messages if m.id and keeper_kind(m) is None]
        archived = self.archive.archived_ids(session, ids)
        return window_of(
            messages,
            newest_notes=newest,
            archived=archived,
            pinned_head=self.config.pinned_head,
        )

    def _next_part(self, pending: Pending, result: StepResult, setup: ModelSetup) -> Pending:
        """After a part's cut: the window it left and the next part of the backlog."""
        notes = self.notes(pending.session, head=state_head(result.state))
        return self.decisions.next_part(pending, result, setup, notes)

    # ----------------------------------------------------------------- finishing

    def _finish_without_cut(
        self, pending: Pending, given: Sequence[BaseMessage], setup: ModelSetup, cuts: int
    ) -> StepResult:
        """The step's result when its last window needs no cut (``cuts``: the parts of a
        backlog cut before it)."""
        messages, state = pending.messages, pending.state
        if cuts:  # a question after a backlog gets the RULES its cuts wrote, as after a cut
            messages, _size, block = self.commit.rules_beside_open_question(
                pending.session, messages, pending, pending.notes, setup, 0
            )
            if block is not None:
                state = {**state, "seen": [*state["seen"], str(block.id)]}
                self.counters(pending.session).rules_injected += 1
        self.sessions.save_counters(pending.session)
        tail = None if cuts else self.tails.left(pending, messages, state)
        self.last_entries.keep(
            pending.session, pending.entries, messages, tail, before=pending.before
        )
        # the window the last step ended with is sent on as it was given (``_appended``)
        appending = pending.appending
        same = 0 if appending is None or cuts or pending.replaced else appending.length
        given_ids = list(map(_ID, given[same:]))
        ids = list(map(_ID, messages[same:]))
        changed = ids != given_ids or pending.replaced
        rewritten = changed and (ids[: len(given_ids)] != given_ids or pending.replaced)
        return StepResult(messages, state, changed, rewritten, cut=cuts > 0)

    def _sync_index(self, session: str) -> None:
        """Index archived turns the retrievers have not seen yet, in the background: the step
        does not wait for embeddings, and a search of the session waits only for its own."""
        with self._span("index_sync", session):
            self.indexing.schedule(session)

    def _index_retrievers(self) -> tuple[Retriever, ...]:
        if self.passages_retriever is not self.retriever:
            return (self.retriever, self.passages_retriever)
        return (self.retriever,)

    def _check_index(self, session: str) -> None:
        """Once a process and session: an index holding text the archive lacks is rebuilt
        from the archive before anything is searched or added (``indexing.reconcile``)."""
        if session in self._indexes_checked:
            return
        with self.session(session):
            if session not in self._indexes_checked:
                reconcile(
                    self.archive, session, self._index_retrievers(), unit=self.config.passages
                )
                self._indexes_checked.add(session)

    def _check_archive_holds(self, session: str, kstate: Mapping[str, Any]) -> None:
        """Once a process and session: a thread whose state says cuts were made must find
        their NOTES in the archive. An archive replaced or deleted since (or an in-memory one
        behind a checkpointer that persists) would otherwise go on as if nothing was lost."""
        if session in self._states_checked:
            return
        noted = int(kstate.get("notes_item", 0) or 0)
        if noted > 0 and self.archive.latest_notes(session) is None:
            raise ArchiveError(
                f"the thread {session!r} has made cuts (its state has notes up to item "
                f"{noted}), but the archive {self.archive!r} holds no NOTES of it: the archive "
                "was replaced or deleted since those cuts, and the turns they archived are not "
                "in it. Point archive= at the file that holds them (or restore it from a "
                "backup), or continue in a new thread"
            )
        self._states_checked.add(session)

    # ----------------------------------------------------------------- the model's side

    def work_kwargs(self, session: str, messages: Sequence[BaseMessage]) -> dict[str, Any]:
        """Call kwargs for the agent's own next model call.

        Thinking stays on while a question is open (without it a measured run repeated one
        search 790 times); the one reply after a stop line is sampled with some randomness.
        """
        facts = self.last_entries.facts_of(session, messages)  # the window a step just left
        if facts is None:
            layout = self.window.layout(messages)
            open_at = open_question_index(messages, self.detector, start=layout.head_end)
        else:
            open_at = facts.open_at
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

    def search_offered(self, session: str, messages: Sequence[BaseMessage] | None = None) -> bool:
        """Whether the next work call is offered the search tool: not after the stop line,
        until new input arrives (every adapter asks here, and leaves the tool out). In a graph,
        ``messages`` (the branch's) say it: their search results carry the guards' state.
        Never when the graph run is too near its recursion limit for one more search and the
        answer after it (:mod:`~keeper_middleware.search.run_steps`)."""
        if not room_for_a_search():
            return False
        if messages is not None:
            carried = withheld_now(messages, self.items.is_new_input)
            if carried is not None:
                return not carried
        with self.session(session):
            return not self._guard(session).withheld

    def answer_only(self, session: str, reply: AIMessage) -> AIMessage:
        """A work reply as it stands when the search tool was withheld from its call: any call
        to it is dropped (it would be refused again), so a model that never stops searching
        ends with what else it said."""
        stripped = without_search_calls(reply)
        if stripped is not reply:
            log.info("search call dropped session=%s: the tool was withheld", session)
        return stripped

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
        session = self.copies.of(session)
        with self._span("search", session):
            self._check_index(session)
            return self.searcher.run(session, args, head=head)[0]

    def answer_search(
        self, session: str, args: object, *, state: Mapping[str, Any], call_id: str
    ) -> tuple[str, dict[str, Any] | None]:
        """Answer the ``search_archive`` call ``call_id`` of a graph whose state is ``state``:
        on that state's branch, with the guards' state its messages carry. Returns the reply
        and the result's artifact (the guards' state after the search, for the next one). A
        state without a keeper step's values (a graph that archives by itself) searches the
        session as of its latest cut, with the session's own guards."""
        kstate = state.get(KEEPER_CHANNEL)
        session = self.archived_as(session, kstate if isinstance(kstate, Mapping) else None)
        with self._span("search", session):
            return self.searcher.answer(session, args, state=state, call_id=call_id)

    def retrieve(self, session: str, query: str, *, k: int = 10, head: Head = TIP) -> list[Hit]:
        """The archive's best matches for ``query`` on the branch ``head``, as the search
        tool finds them (without its guards or its rendering).

        Args:
            session: the thread id.
            query: what to search for.
            k: how many hits at most.
            head: the branch (a cut key from :meth:`head_of`); the thread's latest by default.

        Raises:
            UnknownSessionError: no step ever ran under ``session`` with this archive (a
                mistyped thread id, or another archive), so there is nothing to search.
        """
        session = self.copies.of(session)
        if not self.sessions.known(session):
            raise UnknownSessionError(
                f"thread {session!r} is unknown to this keeper: no step ran under that thread id "
                f"with the archive {self.archive!r}. Check the thread id (the run's "
                "config['configurable']['thread_id']) and that the keeper opens the archive "
                f"the thread ran with; known threads: keeper.archive.sessions()"
            )
        self._check_index(session)
        with background_worker().foreground():
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


def _with_id(message: BaseMessage) -> BaseMessage:
    if message.id:
        return message
    return message.model_copy(update={"id": str(uuid.uuid4())})
