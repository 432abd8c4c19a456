"""Which archived turns become search passages, and indexing them off the step's path.

The keeper indexes a session's archive after every cut, and a migration rebuilds the index of
every session in its new home; both go through :func:`catch_up`, so an index built either way
holds the same passages at the same positions. Every passage carries its message's context
(:func:`~keeper_middleware.search.turn_context.turn_context`: who, when, which item).

A cut does not wait for its passages to be embedded (tens of milliseconds of CPU a message):
:class:`BackgroundIndexing` hands the catch-up to the process's indexing worker and the step
returns. A search first hands its own session's new turns to the indexes itself (not behind
other sessions' work): the keyword index holds them at once; an embedding index's search
writes its session's queued vectors first, and a hybrid's ranks passages whose vectors are not
written yet by keyword alone. Progress is saved in the archive only after the indexes have
written the passages, so a crash loses none: the next catch-up (the session's first step or
search in a new process) indexes them again.

Each record's first passage position is kept beside it in the archive (``set_positions``, when
its passages are handed over): a branch of a forked conversation is a set of records, and this
is how its passages are found in an index shared by every branch (``branches``). Records indexed
before positions were kept get theirs worked out again, once, the first time a branch needs them
(:func:`ensure_positions`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from keeper_middleware.archive.records import ArchivedTurn
from keeper_middleware.archive.store import ArchiveStore, put_values
from keeper_middleware.errors import ConfigurationError
from keeper_middleware.retrievers.background import BackgroundWorker, background_worker
from keeper_middleware.retrievers.base import Passage, Retriever, stored_count
from keeper_middleware.retrievers.passages import passages_of
from keeper_middleware.search.schema import SEARCH_TOOL_NAME
from keeper_middleware.search.turn_context import turn_context

log = logging.getLogger(__name__)

INDEXED_SEQ = "indexed_seq"
NEXT_POSITION = "next_position"
_BATCH = 2_000
_PAGE = 512
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
    most: int | None = None,
) -> int:
    """Index the session's turns the retrievers have not seen yet, cut into passages as
    ``unit`` says (``KeeperConfig.passages``); returns passages added. ``most``: index at most
    that many turns and save the progress (call again to go on), so a build of millions of
    turns can be watched, and a crash loses one slice rather than all of it.

    Safe after a crash at any point: the progress is saved only once the retrievers have
    written the passages (``flush``), and re-adding a passage at a position it already holds
    replaces it.
    """
    if most is not None and most < 1:
        raise ConfigurationError(f"most must be a positive int or None, got {most}.")
    added, progress = hand_over(archive, [session], retrievers, unit=unit, most=most)
    settle(archive, progress, retrievers)
    return added


def catch_up_sessions(
    archive: ArchiveStore,
    sessions: Sequence[str],
    retrievers: tuple[Retriever, ...],
    *,
    unit: str = "messages",
) -> int:
    """:func:`catch_up` for several sessions at once: their passages go to the retrievers
    together (an embedding backend batches them), and each session's progress is saved after."""
    added, progress = hand_over(archive, sessions, retrievers, unit=unit)
    settle(archive, progress, retrievers)
    return added


Marks = dict[str, tuple[int, int]]
"""Per session, (the last archived turn's ``seq`` handed to the retrievers, the next position)."""


def hand_over(
    archive: ArchiveStore,
    sessions: Sequence[str],
    retrievers: tuple[Retriever, ...],
    *,
    unit: str,
    start: Marks | None = None,
    most: int | None = None,
) -> tuple[int, Marks]:
    """Give the retrievers the passages of the sessions' turns after their saved progress (or
    after ``start``, what this process has handed over already), at most ``most`` turns a
    session; returns the passages added and how far each session got. Nothing is saved: a
    retriever may still be writing them."""
    added = 0
    batch: list[Passage] = []
    progress: Marks = {}
    for session in sessions:
        done = int(archive.get_value(session, INDEXED_SEQ) or -1)
        position = int(archive.get_value(session, NEXT_POSITION) or 0)
        if start and session in start and start[session][0] > done:
            done, position = start[session]
        seen = done
        positions: list[tuple[int, int]] = []
        for turn in archive.turns(session, after_seq=done):
            if most is not None and len(positions) >= most:
                break
            positions.append((turn.seq, position))
            passages = turn_passages(turn, unit, position)
            position += len(passages)
            batch.extend(passages)
            seen = turn.seq
            if len(batch) >= _BATCH:
                added += _add(retrievers, batch)
                batch = []
        if seen != done:
            archive.set_positions(session, positions)
            progress[session] = (seen, position)
    added += _add(retrievers, batch)
    return added, progress


def settle(archive: ArchiveStore, progress: Marks, retrievers: tuple[Retriever, ...]) -> None:
    """Wait until the retrievers have written what was handed over, then save the progress:
    saved only once written, so a crash before loses nothing (it is indexed again)."""
    if not progress:
        return
    for retriever in retrievers:
        retriever.flush()
    for session, (seen, position) in progress.items():
        put_values(archive, session, {INDEXED_SEQ: seen, NEXT_POSITION: position})


def reconcile(
    archive: ArchiveStore,
    session: str,
    retrievers: tuple[Retriever, ...],
    *,
    unit: str = "messages",
) -> bool:
    """Rebuild a session's index when it holds passages the archive never indexed; True when
    it did.

    The archive records how many passages it has given the index (``NEXT_POSITION``); an index
    holding more belongs to turns the archive no longer has (the archive file was deleted or
    replaced by an older copy), and search would serve their text. Such an index is emptied for
    the session and built again from the archive. An index holding fewer is left as it is
    (a store that counts only what this process added cannot tell), unless it holds none of
    the session's passages and counts what it stores (:func:`stored_count`): a deleted index
    folder, or one a new keyword engine starts, is built again from the archive (re-adding a
    passage replaces it, so the sides that kept theirs lose nothing).
    """
    position = int(archive.get_value(session, NEXT_POSITION) or 0)
    stale = [r for r in retrievers if r.count(session) > position]
    if stale:
        log.warning(
            "index rebuilt session=%s: it held passages beyond the %d the archive %r indexed "
            "(the archive was replaced or deleted since)",
            session,
            position,
            archive,
        )
        for retriever in retrievers:
            retriever.delete_session(session)
    elif position > 0 and any(stored_count(r, session) == 0 for r in retrievers):
        log.warning(
            "index rebuilt session=%s: it holds none of the %d passages the archive %r indexed "
            "(the index was deleted, or is new)",
            session,
            position,
            archive,
        )
    else:
        return False
    put_values(archive, session, {INDEXED_SEQ: -1, NEXT_POSITION: 0})
    catch_up(archive, session, retrievers, unit=unit)
    return True


def _add(retrievers: tuple[Retriever, ...], batch: list[Passage]) -> int:
    if batch:
        for retriever in retrievers:
            retriever.add(batch)
    return len(batch)


class BackgroundIndexing:
    """One keeper's sessions indexed on the process's worker (see the module docstring).

    ``schedule`` after a cut; ``ready`` before a search; ``drain`` (at close) indexes what is
    queued. Two steps a session: its new passages are *handed over* to the retrievers (the
    keyword index writes them at once, an embedding index queues them), then *settled*: once
    the retrievers have written them, the progress is saved in the archive.
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
        self._handing: set[str] = set()
        """Sessions whose turns are being handed over now (one thread at a time)."""
        self._handed: Marks = {}
        """How far this process has handed each session over (ahead of the saved progress)."""
        self._saved: Marks = {}
        self._changed = threading.Condition()
        self._settling = threading.Lock()
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
        """Hand every archived turn of ``session`` to the retrievers before a search: here and
        now, not behind other sessions' work, and also turns archived by another process or
        left by a crash. The keyword index then holds them all; vectors still being made are
        waited for by an embedding index's search (its own session's only), or ranked by
        keyword alone by a hybrid's."""
        with self._worker.waiting_for_worker(), self._changed:
            while session in self._handing and not self._worker.on_worker():
                self._changed.wait()
            self._handing.add(session)
            self._seen.add(session)
            start = {session: self._handed[session]} if session in self._handed else {}
        progress: Marks = {}
        try:
            _, progress = hand_over(
                self._archive, [session], self._retrievers(), unit=self._unit, start=start
            )
        finally:
            with self._changed:
                self._handing.discard(session)
                self._handed.update(progress)
                self._changed.notify_all()
        if progress:
            self.schedule(session)  # settled in the background once the retrievers wrote it

    def forget(self, session: str) -> None:
        """Drop the session's queued catch-up and wait for one under way (it is being erased)."""
        with self._changed:
            self._queued.pop(session, None)
            while session in self._handing and not self._worker.on_worker():
                self._changed.wait()
            self._seen.discard(session)
            self._handed.pop(session, None)
            self._saved.pop(session, None)
        with self._settling:  # a settle under way finishes before the session is erased
            pass

    def drain(self) -> None:
        """Index everything queued, here and now, and wait for what is under way."""
        while True:
            with self._changed:
                if not self._queued and (not self._handing or self._worker.on_worker()):
                    break
                if not self._queued:
                    self._changed.wait()
                    continue
            self._run()
        with self._settling:
            pass

    def next_position(self, session: str) -> int:
        """Where the session's next passage goes, counting what this process has handed over
        and not saved yet (``NEXT_POSITION`` in the archive lags until it is settled)."""
        with self._changed:
            handed = self._handed.get(session)
        saved = int(self._archive.get_value(session, NEXT_POSITION) or 0)
        return saved if handed is None else max(saved, handed[1])

    def pending(self) -> int:
        """Sessions queued or being handed over now."""
        with self._changed:
            return len(self._queued) + len(self._handing)

    def _run(self) -> None:
        while True:
            with self._changed:
                chosen = [s for s in self._queued if s not in self._handing][:SESSIONS_A_BATCH]
                if not chosen:
                    return
                for session in chosen:
                    del self._queued[session]
                self._handing.update(chosen)
                start = {s: self._handed[s] for s in chosen if s in self._handed}
            progress: Marks = {}
            try:
                retrievers = self._retrievers()
                _, progress = hand_over(
                    self._archive, chosen, retrievers, unit=self._unit, start=start
                )
            except Exception:
                log.exception(
                    "indexing sessions %s in the background failed; their turns stay in the "
                    "archive and are indexed at their next cut or search",
                    ", ".join(chosen),
                )
                continue
            finally:
                with self._changed:
                    self._handing.difference_update(chosen)
                    self._handed.update(progress)
                    self._changed.notify_all()
            self._settle(chosen, retrievers)

    def _settle(self, sessions: list[str], retrievers: tuple[Retriever, ...]) -> None:
        """Save the progress of what was handed over, once the retrievers have written it
        (one settle at a time, so saved progress only moves forward)."""
        with self._settling:
            with self._changed:
                due = {
                    s: self._handed[s]
                    for s in sessions
                    if s in self._handed and self._handed[s] != self._saved.get(s)
                }
            try:
                settle(self._archive, due, retrievers)
            except Exception:
                log.exception(
                    "writing the passages of sessions %s failed; they are indexed again at "
                    "their next cut or search",
                    ", ".join(sessions),
                )
                with self._changed:
                    for session in due:
                        self._handed.pop(session, None)  # hand them over again from the saved
                return
            with self._changed:
                self._saved.update(due)


class _CatchUpJob:
    """The name of one keeper's catch-up job on the worker (one queued at a time)."""

    __slots__ = ("archive",)

    def __init__(self, archive: str) -> None:
        self.archive = archive

    def __repr__(self) -> str:
        return f"catch-up of {self.archive}"


def ensure_positions(
    archive: ArchiveStore,
    session: str,
    retrievers: tuple[Retriever, ...],
    *,
    unit: str = "messages",
    before_rebuild: Callable[[], None] | None = None,
) -> None:
    """Give the records indexed before positions were kept (an archive of an earlier release)
    their positions: the passages they were cut into are counted again, as ``catch_up`` cut
    them. When the count does not come out where the index is (it was built with another
    ``unit``), the session's index is built again from the archive, positions and all."""
    done = int(archive.get_value(session, INDEXED_SEQ) or -1)
    if done < 0 or archive.positions(session, [0]).get(0) is not None:
        return
    position = 0
    positions: list[tuple[int, int]] = []
    known: int | None = None
    stored: dict[int, int | None] = {}
    for turn in archive.turns(session):
        if turn.seq > done:
            break
        if turn.seq not in stored:  # the stored positions are read a page at a time
            stored = archive.positions(session, range(turn.seq, turn.seq + _PAGE))
        known = stored.get(turn.seq)
        if known is not None:  # the first record indexed since positions are kept
            break
        positions.append((turn.seq, position))
        position += len(turn_passages(turn, unit, position))
    if known is None:
        known = int(archive.get_value(session, NEXT_POSITION) or 0)
    if known == position:
        archive.set_positions(session, positions)
        return
    log.warning(
        "session=%s: the search index was built with other passages than %r (%d counted, %d "
        "indexed); indexing the session again",
        session,
        unit,
        position,
        known,
    )
    if before_rebuild is not None:
        before_rebuild()
    for retriever in retrievers:
        retriever.delete_session(session)
    put_values(archive, session, {INDEXED_SEQ: -1, NEXT_POSITION: 0})
    catch_up(archive, session, retrievers, unit=unit)
