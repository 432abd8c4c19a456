"""The keeper's memory as a function of the branch being run.

LangGraph restores every channel of a graph's state from the checkpoint it resumes from, so what
the keeper keeps in its own channel (``keeper`` in the graph state) forks with the graph for free:
the channel holds the key of the branch's latest cut, its *head* (:data:`HEAD_KEY`). Everything
kept beside the graph is addressed from it: the NOTES in effect at that cut, the records the
branch sees (its chain of cuts back to the first), the entries moved out of its NOTES, the
search index's passages of those records. Nothing is copied per branch (docs/branches.md).

A session that never forked is one line of cuts, and a branch at its latest cut sees all of it:
no filter is made and no query added (``Chain.whole``). The rest is worked out once per head and
remembered, since a chain never changes once its cuts are written.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langchain_core.messages import BaseMessage

from keeper_middleware.archive.records import TIP, Chain, CutRecord, Head
from keeper_middleware.archive.store import ArchiveStore, UnknownCutError
from keeper_middleware.messages.facts import keeper_kind
from keeper_middleware.retrievers.base import Retriever, Spans
from keeper_middleware.search.indexing import NEXT_POSITION, BackgroundIndexing, ensure_positions

log = logging.getLogger(__name__)

HEAD_KEY = "head"
"""Where the keeper's graph-state channel keeps the key of the branch's latest cut (None: no cut
on this branch yet)."""
ARCHIVE_SESSION_KEY = "session"
"""Keeper state key of the archive session the state's branch lives in: the thread's own, and
for a copy of the state on another thread, the thread it was copied from."""
NOTES_ID_PREFIX = "notes-"
"""The NOTES message's id is this and the key of the cut that wrote it."""
_KEPT = 256


def state_head(kstate: Mapping[str, Any] | None) -> str | None:
    """The head a keeper state names (None: the branch has no cut, or the state is an earlier
    release's, which names none: see :meth:`Branches.head`)."""
    head = (kstate or {}).get(HEAD_KEY)
    return head if isinstance(head, str) else None


class Branches:
    """Finds what one branch of a session sees, for one keeper's archive and index."""

    def __init__(
        self,
        archive: ArchiveStore,
        retrievers: Callable[[], tuple[Retriever, ...]],
        unit: str,
    ) -> None:
        self.archive = archive
        self._retrievers = retrievers
        self._unit = unit
        self.index: BackgroundIndexing | None = None
        """The keeper's indexing: a branch's turns are handed to the index before their positions
        are read, and an index rebuilt for positions waits for the session's catch-up."""
        self._lock = threading.Lock()
        self._chains: OrderedDict[tuple[str, str | None], Chain] = OrderedDict()
        self._spans: OrderedDict[tuple[str, str | None], Spans] = OrderedDict()
        self._positioned: set[str] = set()

    # ------------------------------------------------------------------ which head

    def head(
        self, session: str, kstate: Mapping[str, Any] | None, messages: Sequence[BaseMessage]
    ) -> str | None:
        """The head of the branch a step runs on: the one its state names. A state that names
        none (an earlier release's, or none kept at all: a graph without a checkpointer that is
        handed its history each time) finds it from the NOTES message in view; without one, the
        branch has no cut yet."""
        if kstate and HEAD_KEY in kstate:
            return state_head(kstate)
        return self.head_in_view(session, messages)

    def newest_notes(self, session: str, messages: Sequence[BaseMessage]) -> BaseMessage | None:
        """The NOTES message among ``messages`` whose cut the archive committed last (None:
        no NOTES message, or none the archive knows): of a history handed back whole, the one
        the agent's latest window held (``step.handed_back``)."""
        newest: tuple[int, BaseMessage] | None = None
        for message in messages:
            if keeper_kind(message) != "notes" or not str(message.id).startswith(NOTES_ID_PREFIX):
                continue
            found = self.archive.find_cut(session, str(message.id)[len(NOTES_ID_PREFIX) :])
            if found is not None and (newest is None or found.ordinal > newest[0]):
                newest = (found.ordinal, message)
        return None if newest is None else newest[1]

    def head_in_view(self, session: str, messages: Sequence[BaseMessage]) -> str | None:
        """The branch's head as the messages in view say it: the cut that wrote the NOTES in
        view, and the commits after it on its line without NOTES of their own (messages archived
        whole as they arrived, before the next cut); None when no NOTES are in view (no cut
        yet: anything archived whole before the first cut is taken up by it)."""
        named = notes_cut_in_view(messages)
        if named is None:
            return None
        found = self.archive.find_cut(session, named)
        if found is None:
            log.warning(
                "session=%s: the NOTES in view name a cut the archive does not hold; the "
                "branch starts from no cut",
                session,
            )
            return None
        head = found.cut_key
        for cut in self.archive.cuts(session, after=found.ordinal):
            if cut.parent != head:
                continue  # another branch's
            if cut.notes_version is not None:
                break  # the next cut of this line, made after the state in view
            head = cut.cut_key
        return head

    # ------------------------------------------------------------------ what a head sees

    def chain(self, session: str, head: Head) -> Chain:
        """The branch whose latest cut is ``head`` (a head the archive does not hold sees
        nothing, with a warning)."""
        if head is not TIP:
            with self._lock:
                known = self._chains.get((session, head))
                if known is not None:
                    self._chains.move_to_end((session, head))
                    return known
        try:
            chain = self.archive.chain(session, head)
        except UnknownCutError as exc:
            log.warning("%s; it sees nothing of the archive", exc)
            return Chain(session, None, whole=False, ordinals=Spans(((0, 1),)))
        if not chain.whole:  # a chain never changes; "whole" may, when another branch forks
            with self._lock:
                _remember(self._chains, (session, chain.head), chain)
        return chain

    def passages(self, session: str, head: Head) -> Spans | None:
        """The search index positions of what ``head`` sees (None: everything, no filter)."""
        chain = self.chain(session, head)
        if chain.whole:
            return None
        key = (session, chain.head)
        with self._lock:
            known = self._spans.get(key)
        if known is not None:
            return known
        spans, complete = self._positions_of(chain)
        if complete:
            with self._lock:
                _remember(self._spans, key, spans)
        return spans

    def _positions_of(self, chain: Chain) -> tuple[Spans, bool]:
        """The passages' positions of the chain's records, and whether every bound had one
        recorded (only then are they remembered). Positions follow ``seq``, so a bound not
        indexed yet starts where the index ends."""
        session = chain.session
        if not chain.seqs:
            return Spans(), True
        if self.index is not None:
            self.index.ready(session)  # the newest records' positions are known once handed over
        if session not in self._positioned:
            index = self.index
            ensure_positions(
                self.archive,
                session,
                self._retrievers(),
                unit=self._unit,
                # no catch-up of the session may run while its index is built again
                before_rebuild=(lambda: index.forget(session)) if index is not None else None,
            )
            self._positioned.add(session)
        walk = chain.seqs.walk  # the branch's own order: its passages follow it
        bounds = {edge for span in walk for edge in span}
        known = self.archive.positions(session, bounds)
        end = (
            int(self.archive.get_value(session, NEXT_POSITION) or 0)
            if self.index is None
            else self.index.next_position(session)  # a bound handed over but not yet saved
        )
        complete = all(known.get(bound) is not None for bound in bounds)
        ranges = []
        for start, stop in walk:
            low = known.get(start)
            high = known.get(stop)
            ranges.append((end if low is None else low, end if high is None else high))
        return Spans.ordered(ranges), complete

    def forget(self, session: str) -> None:
        with self._lock:
            for cache in (self._chains, self._spans):
                for key in [k for k in cache if k[0] == session]:
                    del cache[key]
            self._positioned.discard(session)


def notes_cut_in_view(messages: Sequence[BaseMessage]) -> str | None:
    """The key of the cut that wrote the NOTES message in view (None: none in view)."""
    return next(
        (
            str(m.id)[len(NOTES_ID_PREFIX) :]
            for m in messages
            if keeper_kind(m) == "notes" and str(m.id).startswith(NOTES_ID_PREFIX)
        ),
        None,
    )


def commit_on_branch(
    archive: ArchiveStore, session: str, head: str | None, **cut: Any
) -> CutRecord:
    """``archive.commit_cut`` after ``head``; a head the archive does not hold (it was erased
    while the graph's checkpoints lived on) starts the branch afresh, with a warning, rather
    than stopping the thread for good."""
    try:
        return archive.commit_cut(session, parent=head, **cut)
    except UnknownCutError as exc:
        log.warning("%s; this cut starts the branch afresh", exc)
        return archive.commit_cut(session, parent=None, **cut)


def _remember(cache: OrderedDict[Any, Any], key: Any, value: Any) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > _KEPT:
        cache.popitem(last=False)
