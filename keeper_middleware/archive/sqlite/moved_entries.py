"""The moved STATE entries of an SQLite archive, read and written (a mixin of
:class:`~keeper_middleware.archive.sqlite.archive.SQLiteArchive`; the SQL is
:mod:`~keeper_middleware.archive.sqlite.moved`'s).

A session's entries written by an earlier release as one value are adopted as rows the first
time the session is read or written here, in one write transaction.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Collection, Iterator
from typing import TYPE_CHECKING

from keeper_middleware.archive.moved_rows import LEGACY_ENTRIES, LEGACY_KEYS
from keeper_middleware.archive.records import TIP, Chain, Head, MovedUpdate, _require_session
from keeper_middleware.archive.sqlite import branches as sqlite_branches
from keeper_middleware.archive.sqlite import moved as sqlite_moved
from keeper_middleware.archive.sqlite.reads import TURN_PAGE

if TYPE_CHECKING:
    from keeper_middleware.errors.sqlite import FileConnection

__all__ = ["SQLiteMovedEntries"]


class SQLiteMovedEntries:
    """The moved entries' reads and writes (mixed into ``SQLiteArchive``, which opens the
    connection and holds the state named here)."""

    _lock: threading.RLock
    _adopted: set[str]

    if TYPE_CHECKING:

        def _live(self) -> FileConnection: ...

        def chain(self, session: str, head: Head = TIP) -> Chain: ...

    def update_moved(self, session: str, update: MovedUpdate) -> None:
        _require_session(session)

        def work(conn: sqlite3.Connection) -> None:
            tip, forked, count = sqlite_branches.tip_of(conn, session)
            if not forked:
                sqlite_moved.apply_linear(conn, session, update, ordinal=count)
                return
            holds = sqlite_branches.chain_at(conn, session, tip, tip, forked).holds_ordinal
            sqlite_moved.apply(conn, session, update, ordinal=count, holds=holds)

        self._write(session, work)

    def _write(self, session: str, work: Callable[[sqlite3.Connection], None]) -> None:
        """``work`` in one write transaction, after adopting the session's old values."""
        with self._lock:
            conn = self._live()
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute("INSERT OR IGNORE INTO sessions (session) VALUES (?)", (session,))
                _, forked, count = sqlite_branches.tip_of(conn, session)
                sqlite_moved.adopt_legacy(conn, session, ordinal=count, linear=not forked)
                work(conn)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            self._adopted.add(session)

    def _adopt(self, session: str) -> sqlite3.Connection:
        """The connection, once the session's old values (if any) are rows (lock held)."""
        conn = self._live()
        if session not in self._adopted:
            found = conn.execute(
                "SELECT 1 FROM kv WHERE session = ? AND key IN (?, ?)",
                (session, LEGACY_KEYS, LEGACY_ENTRIES),
            ).fetchone()
            if found is None:
                self._adopted.add(session)
            else:
                self._write(session, lambda conn: None)
        return conn

    def _current(self, conn: sqlite3.Connection, session: str, within: Chain | None) -> bool:
        """Whether a read of moved entries can use the current rows (the branch is the whole of
        a session that never forked); else it reads the log."""
        if within is not None:
            return within.whole
        return not sqlite_branches.tip_of(conn, session)[1]

    def _holds(self, session: str, within: Chain | None) -> Callable[[int], bool]:
        """Which cut ordinals a read of the log counts (lock held)."""
        if within is None:
            within = self.chain(session, TIP)
        return within.holds_ordinal

    def moved_named(
        self, session: str, words: Collection[str], *, within: Chain | None = None
    ) -> list[tuple[str, str]]:
        with self._lock:
            conn = self._adopt(session)
            if self._current(conn, session, within):
                return sqlite_moved.named_current(conn, session, words)
            rows = sqlite_moved.named(conn, session, words, self._holds(session, within))
        return [(row.key, str(row.value)) for row in rows]

    def moved_among(
        self, session: str, folded: Collection[str], *, within: Chain | None = None
    ) -> list[str]:
        with self._lock:
            conn = self._adopt(session)
            if self._current(conn, session, within):
                return sqlite_moved.among_current(conn, session, folded)
            rows = sqlite_moved.among(conn, session, folded, self._holds(session, within))
        return [row.key for row in rows]

    def moved_rows(
        self, session: str, *, within: Chain | None = None
    ) -> Iterator[tuple[str, str | None]]:
        with self._lock:
            conn = self._adopt(session)
            current = self._current(conn, session, within)
            logged = (
                [] if current else sqlite_moved.every(conn, session, self._holds(session, within))
            )
        if not current:
            for entry in logged:
                yield entry.key, entry.value
            return
        last = -1
        while True:
            with self._lock:
                page = sqlite_moved.every_current(self._live(), session, last, TURN_PAGE)
            if not page:
                return
            for row in page:
                yield row[0], row[1]
            last = page[-1][2]
