"""How a step takes its messages in before it decides (a mixin of
:class:`~keeper_middleware.keeper.Keeper`): the append path, which starts from what the session's
last step found in its window, or the full path; then the step's result when no cut is due.

:meth:`~keeper_middleware.keeper.Keeper.step` runs these in its order and does the model calls
and commits; each decision is made by the parts named in the class (arrivals, decisions, tails),
built once by the keeper.
"""

from __future__ import annotations

import operator
import uuid
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from langchain_core.messages import BaseMessage

from keeper_middleware.archive.records import TIP, Head
from keeper_middleware.archive.store import ArchiveStore
from keeper_middleware.config import KeeperConfig
from keeper_middleware.errors import ArchiveError
from keeper_middleware.messages.facts import close_unanswered_calls, keeper_kind
from keeper_middleware.messages.marks import verified
from keeper_middleware.model.setup import ModelSetup
from keeper_middleware.notes.block import Notes
from keeper_middleware.reinjection.questions import QuestionDetector
from keeper_middleware.retrievers.base import Retriever
from keeper_middleware.search.indexing import BackgroundIndexing, reconcile
from keeper_middleware.sessions.branches import (
    ARCHIVE_SESSION_KEY,
    HEAD_KEY,
    Branches,
    state_head,
)
from keeper_middleware.sessions.counters import Counters
from keeper_middleware.sessions.json_copy import json_copy
from keeper_middleware.sessions.starts import StartWarnings
from keeper_middleware.sessions.state import SessionState
from keeper_middleware.step.appended import Tails
from keeper_middleware.step.arrivals import Arrivals
from keeper_middleware.step.backlog import part_state, split_backlog
from keeper_middleware.step.commit import CutCommit
from keeper_middleware.step.cut import KEPT_KEY, recount_kept, uncount_removed
from keeper_middleware.step.decide import Decisions
from keeper_middleware.step.entries import Entry, first_fresh, messages_of
from keeper_middleware.step.handed_back import as_left, window_of
from keeper_middleware.step.items import ITEMS_SINCE_NOTES
from keeper_middleware.step.known import LastEntries
from keeper_middleware.step.result import Pending, StepResult
from keeper_middleware.step.tail import Appending, WindowFacts
from keeper_middleware.step.window import WindowPolicy

__all__ = ["Preparing"]

_ID = operator.attrgetter("id")


class Preparing:
    """A step's messages taken in and its result when no cut is due (mixed into
    :class:`~keeper_middleware.keeper.Keeper`, which builds every part named here)."""

    config: KeeperConfig
    archive: ArchiveStore
    retriever: Retriever
    passages_retriever: Retriever
    detector: QuestionDetector
    window: WindowPolicy
    sessions: SessionState
    starts: StartWarnings
    branches: Branches
    indexing: BackgroundIndexing
    arrivals: Arrivals
    decisions: Decisions
    commit: CutCommit
    last_entries: LastEntries
    tails: Tails
    _indexes_checked: set[str]
    _states_checked: set[str]

    if TYPE_CHECKING:  # the keeper's own, defined beside its state

        def session(self, session: str) -> AbstractContextManager[None]: ...

        def counters(self, session: str) -> Counters: ...

        def notes(self, session: str, *, head: Head = TIP) -> Notes: ...

        def _span(self, phase: str, session: str) -> AbstractContextManager[None]: ...

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


def _with_id(message: BaseMessage) -> BaseMessage:
    if message.id:
        return message
    return message.model_copy(update={"id": str(uuid.uuid4())})
