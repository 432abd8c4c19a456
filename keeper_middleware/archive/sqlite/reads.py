"""Reading an SQLite archive's turns, cuts and NOTES (a mixin of
:class:`~keeper_middleware.archive.sqlite.archive.SQLiteArchive`).

Every read pages by its key (no cursor stays open between pages, so a long read never blocks a
cut), and a branch's records are read run by run in its own order. The NOTES in effect at a cut
never change once committed, so they are remembered as last read; the session's latest changes
only with a cut, which forgets it (``commit_cut``).
"""

from __future__ import annotations

import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from keeper_middleware.archive.records import (
    TIP,
    ArchivedTurn,
    Chain,
    CutRecord,
    Head,
    NotesVersion,
    _require_session,
)
from keeper_middleware.archive.rows import CUT_COLUMNS, NOTES_COLUMNS, TURN_COLUMNS
from keeper_middleware.archive.sqlite import branches as sqlite_branches

if TYPE_CHECKING:
    from keeper_middleware.errors.sqlite import FileConnection

__all__ = ["TURN_PAGE", "SQLiteReads", "cut_of"]

_T = TypeVar("_T")
_NOTES_KEPT = 256
_UNKNOWN: Any = object()
"""Not remembered (a session's latest NOTES may be remembered as None: none yet)."""
TURN_PAGE = 256
"""Rows a page of turns, cuts or moved entries."""
_NOTES_PAGE = 8


def _turn(row: sqlite3.Row) -> ArchivedTurn:
    return ArchivedTurn(**dict(row))


def _notes(row: sqlite3.Row) -> NotesVersion:
    return NotesVersion(**dict(row))


def cut_of(row: sqlite3.Row) -> CutRecord:
    """A cut's record from its row."""
    return CutRecord(**dict(row))


class SQLiteReads:
    """The archive's reads (mixed into ``SQLiteArchive``, which opens the connection and
    holds the state named here)."""

    _lock: threading.RLock
    _latest: dict[str, NotesVersion | None]
    _notes_at: OrderedDict[tuple[str, Head], NotesVersion]

    if TYPE_CHECKING:

        def _live(self) -> FileConnection: ...

    def _query(self, sql: str, params: Sequence[Any]) -> list[sqlite3.Row]:
        with self._lock:
            return self._live().execute(sql, params).fetchall()

    def cuts(self, session: str, *, after: int = 0) -> Iterator[CutRecord]:
        sql = (
            f"SELECT {CUT_COLUMNS} FROM cuts WHERE session = ? AND ordinal > ? "
            f"ORDER BY ordinal LIMIT {TURN_PAGE}"
        )
        return self._pages(sql, lambda last: (session, last), after, "ordinal", cut_of)

    def turns(
        self,
        session: str,
        *,
        from_item: int | None = None,
        to_item: int | None = None,
        after_seq: int = -1,
        within: Chain | None = None,
    ) -> Iterator[ArchivedTurn]:
        """Turns in ``seq`` order; item bounds are inclusive and leave out turns with no item."""
        _require_session(session)
        where = "session = ? AND seq > ?"
        bounds: list[int] = []
        if from_item is not None:
            where, bounds = where + " AND item >= ?", [*bounds, from_item]
        if to_item is not None:
            where, bounds = where + " AND item <= ?", [*bounds, to_item]
        if within is None or within.whole:
            sql = f"SELECT {TURN_COLUMNS} FROM turns WHERE {where} ORDER BY seq LIMIT {TURN_PAGE}"
            return self._pages(sql, lambda last: (session, last, *bounds), after_seq, "seq", _turn)
        return self._walk(where + " AND seq < ?", session, bounds, after_seq, within)

    def _walk(
        self, where: str, session: str, bounds: list[int], after_seq: int, within: Chain
    ) -> Iterator[ArchivedTurn]:
        """The records a branch sees, in its own order: each run of its records read in turn."""
        sql = f"SELECT {TURN_COLUMNS} FROM turns WHERE {where} ORDER BY seq LIMIT {TURN_PAGE}"
        for start, end in within.seqs.walk:

            def params(last: int, end: int = end) -> tuple[Any, ...]:
                return (session, last, *bounds, end)

            yield from self._pages(
                sql,
                params,
                max(after_seq, start - 1),
                "seq",
                _turn,
            )

    def _pages(
        self,
        sql: str,
        params: Callable[[int], Sequence[Any]],
        start: int,
        key: str,
        make: Callable[[sqlite3.Row], _T],
    ) -> Iterator[_T]:
        """Keyset paging: no cursor stays open between pages, so writers are never blocked."""
        self._live()
        last = start
        while rows := self._query(sql, params(last)):
            yield from map(make, rows)
            last = rows[-1][key]

    def turn(
        self, session: str, msg_id: str, *, within: Chain | None = None
    ) -> ArchivedTurn | None:
        rows = self._query(
            f"SELECT {TURN_COLUMNS} FROM turns WHERE session = ? AND msg_id = ? ORDER BY seq DESC",
            (session, msg_id),
        )
        seen = [row for row in rows if within is None or within.sees(int(row["seq"]))]
        if not seen:
            return None
        if within is None:
            return _turn(seen[0])
        return _turn(max(seen, key=lambda row: within.rank(int(row["seq"]))))

    def turn_count(self, session: str) -> int:
        """The turns archived: a cut numbers its turns on from the last (``commit_cut``) and
        only erasing the whole session removes any, so the next number is the count. Read from
        the key's end, it costs the same at any size; counting the rows cost a cut 0.5 ms at
        18,000 turns and grew with every one (PostgreSQL keeps the next number likewise)."""
        rows = self._query(
            "SELECT COALESCE(MAX(seq) + 1, 0) FROM turns WHERE session = ?", (session,)
        )
        return int(rows[0][0])

    def latest_notes(self, session: str) -> NotesVersion | None:
        return self.notes_at(session, TIP)

    def notes_at(self, session: str, head: Head = TIP) -> NotesVersion | None:
        """Every step reads the NOTES at its head: a cut's never change once it is committed,
        and the session's latest changes only with a cut, which runs in one process at a time,
        so both are remembered as last read or written here. The latest is looked up before
        taking the archive's lock, which other sessions' saves hold while they commit: a cut of
        this session drops it under that lock first, so what is found was current when found.
        A head of None (no cut yet on the branch) has no NOTES, which needs no lock nor read."""
        if head is None:
            self._live()  # a closed archive still says so
            return None
        if head is TIP:
            latest = self._latest.get(session, _UNKNOWN)
            if latest is not _UNKNOWN:
                return latest  # type: ignore[no-any-return]
        with self._lock:
            key = (session, head)
            if head is TIP and session in self._latest:
                return self._latest[session]
            if isinstance(head, str) and key in self._notes_at:
                self._notes_at.move_to_end(key)
                return self._notes_at[key]
            row = sqlite_branches.notes_at(self._live(), session, head)
            found = None if row is None else _notes(row)
            if head is TIP:
                self._latest[session] = found
            elif isinstance(head, str) and found is not None:
                self._notes_at[key] = found
                while len(self._notes_at) > _NOTES_KEPT:
                    self._notes_at.popitem(last=False)
            return found

    def notes_versions(self, session: str) -> Iterator[NotesVersion]:
        """Every saved version, oldest first, a few at a time (they add up to gigabytes)."""
        sql = (
            f"SELECT {NOTES_COLUMNS} FROM notes WHERE session = ? AND version > ? "
            f"ORDER BY version LIMIT {_NOTES_PAGE}"
        )
        return self._pages(sql, lambda last: (session, last), 0, "version", _notes)
