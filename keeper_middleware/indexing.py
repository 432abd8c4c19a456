"""Which archived turns become search passages, and indexing them off the step's path.

The keeper indexes a session's archive after every cut, and a migration rebuilds the index of
every session in its new home; both go through :func:`catch_up`, so an index built either way
holds the same passages at the same positions. Every passage carries its message's context
(:func:`~keeper_middleware.turn_context.turn_context`: who, when, which item).

A cut does not wait for its passages to be embedded (tens of milliseconds of CPU a message):
:class:`BackgroundIndexing` hands the catch-up to the process's indexing worker and the step
returns. A search first makes its own session's catch-up happen (taken out of the queue and run
in the searching thread, or waited for when the worker is on it), so it always sees every
archived turn; other sessions' work never holds it up. Progress is saved in the archive only
after the indexes have written the passages, so a crash loses none: the next catch-up (the
session's first step or search in a new process) indexes them again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from keeper_middleware.archive.records import ArchivedTurn
from keeper_middleware.archive.store import ArchiveStore, put_values
from keeper_middleware.retrievers.background import BackgroundWorker, background_worker
from keeper_middleware.retrievers.base import Passage, Retriever
from keeper_middleware.retrievers.passages import passages_of
from keeper_middleware.search.schema import SEARCH_TOOL_NAME
from keeper_middleware.turn_context import turn_context

log = logging.getLogger(__name__)

INDEXED_SEQ = "indexed_seq"
NEXT_POSITION = "next_position"
_BATCH = 2_000
SESSIONS_A_BATCH = 16
"""Most sessions one background catch-up indexes together (their passages share batches)."""


def turn_passages(turn: ArchivedTurn, unit: str, position: int) -> list[Passage]:
    """The passages the keeper indexes for one archived turn, numbered from ``position``: none
    for an empty turn or a search result (a search must not find earlier searches' results)."""
    if not turn.content.strip() or turn.name == SEARCH_TOOL_NAME:
        return []
    return passages_of(
        unit, turn.session, turn.item or 0, turn.content, position, context=turn_context(turn)
    )


def catch_up(
    archive: ArchiveStore,
    session: str,
    retrievers: tuple[Retriever, ...],
    *,
    unit: str = "messages",
) -> int:
    """Index the session's turns the retrievers have not seen yet, cut into passages as
    ``unit`` says (``KeeperConfig.passages``); returns passages added.

    Safe after a crash at any point: the progress is saved only once the retrievers have
    written the passages (``flush``), and re-adding a passage at a position it already holds
    replaces it.
    """
    return catch_up_sessions(archive, [session], retrievers, unit=unit)


def catch_up_sessions(
    archive: ArchiveStore,
    sessions: Sequence[str],
    retrievers: tuple[Retriever, ...],
    *,
    unit: str = "messages",
) -> int:
    """:func:`catch_up` for several sessions at once: their passages go to the retrievers
    together (an embedding backend batches them), and each session's progress is saved after."""
    added = 0
    batch: list[Passage] = []
    progress: dict[str, tuple[int, int]] = {}
    for session in sessions:
        done = int(archive.get_value(session, INDEXED_SEQ) or -1)
        position = int(archive.get_value(session, NEXT_POSITION) or 0)
        seen = done
        for turn in archive.turns(session, after_seq=done):
            passages = turn_passages(turn, unit, position)
            position += len(passages)
            batch.extend(passages)
            seen = turn.seq
            if len(batch) >= _BATCH:
                added += _add(retrievers, batch)
                batch = []
        if seen != done:
            progress[session] = (seen, position)
    added += _add(retrievers, batch)
    if progress:
        for retriever in retrievers:
            retriever.flush()
    for session, (seen, position) in progress.items():
        put_values(archive, session, {INDEXED_SEQ: seen, NEXT_POSITION: position})
    return added


def _add(retrievers: tuple[Retriever, ...], batch: list[Passage]) -> int:
    if batch:
        for retriever in retrievers:
            retriever.add(batch)
    return len(batch)


class BackgroundIndexing:
    """One keeper's sessions indexed on the process's worker (see the module docstring).

    ``schedule`` after a cut; ``ready`` before a search; ``close`` drains what is queued.
    """

    def __init__(
        self,
        archive: ArchiveStore,
        retrievers: Callable[[], tuple[Retriever, ...]],
        *,
        unit: str,
        worker: BackgroundWorker | None = None,
    ) -> None:
        self._archive = archive
        self._retrievers = retrievers
        self._unit = unit
        self._worker = worker if worker is not None else background_worker()
        self._queued: dict[str, None] = {}
        self._running: set[str] = set()
        self._changed = threading.Condition()
        self._seen: set[str] = set()
        self._job = _CatchUpJob(repr(archive))

    def schedule(self, session: str) -> None:
        """Index the session's new turns in the background; returns at once."""
        with self._changed:
            self._queued[session] = None
            self._seen.add(session)
        self._worker.submit(self._job, self._run)

    def schedule_once(self, session: str) -> None:
        """:meth:`schedule` the first time a session is seen in this process, so turns a crash
        left unindexed are indexed before anything asks for them."""
        with self._changed:
            if session in self._seen:
                return
        self.schedule(session)

    def ready(self, session: str) -> None:
        """Return once every archived turn of ``session`` is indexed: its queued catch-up runs
        here, one under way is waited for, and turns archived by another process (or before a
        crash) are indexed here too."""
        with self._changed:
            while session in self._running and not self._worker.on_worker():
                self._changed.wait()
            self._queued.pop(session, None)
            self._running.add(session)
            self._seen.add(session)
        try:
            catch_up(self._archive, session, self._retrievers(), unit=self._unit)
        finally:
            with self._changed:
                self._running.discard(session)
                again = session in self._queued  # scheduled while this ran: the worker skipped it
                self._changed.notify_all()
            if again:
                self._worker.submit(self._job, self._run)

    def forget(self, session: str) -> None:
        """Drop the session's queued catch-up and wait for one under way (it is being erased)."""
        with self._changed:
            self._queued.pop(session, None)
            while session in self._running and not self._worker.on_worker():
                self._changed.wait()
            self._seen.discard(session)

    def drain(self) -> None:
        """Index everything queued, here and now, and wait for what is under way."""
        while True:
            with self._changed:
                if not self._queued and (not self._running or self._worker.on_worker()):
                    return
                if not self._queued:
                    self._changed.wait()
                    continue
            self._run()

    def pending(self) -> int:
        """Sessions queued or being indexed now."""
        with self._changed:
            return len(self._queued) + len(self._running)

    def _run(self) -> None:
        while True:
            with self._changed:
                chosen = [s for s in self._queued if s not in self._running][:SESSIONS_A_BATCH]
                if not chosen:
                    return
                for session in chosen:
                    del self._queued[session]
                self._running.update(chosen)
            try:
                catch_up_sessions(self._archive, chosen, self._retrievers(), unit=self._unit)
            except Exception:
                log.exception(
                    "indexing sessions %s in the background failed; their turns stay in the "
                    "archive and are indexed at their next cut or search",
                    ", ".join(chosen),
                )
            finally:
                with self._changed:
                    self._running.difference_update(chosen)
                    self._changed.notify_all()


class _CatchUpJob:
    """The name of one keeper's catch-up job on the worker (one queued at a time)."""

    __slots__ = ("archive",)

    def __init__(self, archive: str) -> None:
        self.archive = archive

    def __repr__(self) -> str:
        return f"catch-up of {self.archive}"
