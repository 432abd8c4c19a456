"""The moved STATE entries of a PostgreSQL archive, read and written (a mixin of
:class:`~keeper_middleware.archive.postgres.archive.PostgresArchive`; the SQL is
:mod:`~keeper_middleware.archive.postgres.moved`'s).

A session's entries written by an earlier release as one value are adopted as rows the first
time this process reads or writes them, in one transaction with the session's row locked.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from keeper_middleware.archive.postgres import branches as pg_branches
from keeper_middleware.archive.postgres import moved as pg_moved
from keeper_middleware.archive.postgres.reads import TURN_PAGE
from keeper_middleware.archive.postgres.rows import refuse_nul
from keeper_middleware.archive.records import TIP, Chain, MovedUpdate, _require_session

__all__ = ["PostgresMovedEntries"]


class PostgresMovedEntries:
    """The moved entries' reads and writes (mixed into ``PostgresArchive``, which opens the
    pool, names the schema and holds the state named here)."""

    schema: str
    _adopted: set[str]

    if TYPE_CHECKING:

        def _errors(self, doing: str) -> AbstractContextManager[Any]: ...

        def _live_pool(self) -> Any: ...

    def update_moved(self, session: str, update: MovedUpdate) -> None:
        _require_session(session)
        refuse_nul(session, "session")

        def work(conn: Any) -> None:
            tip, forked, count = pg_branches.tip_of(conn, self.schema, session)
            if not forked:
                pg_moved.apply_linear(conn, self.schema, session, update, ordinal=count)
                return
            chain = pg_branches.chain_at(conn, self.schema, session, tip, tip, forked)
            pg_moved.apply(
                conn, self.schema, session, update, ordinal=count, holds=chain.holds_ordinal
            )

        self._write_moved(session, work)

    def _write_moved(self, session: str, work: Callable[[Any], None]) -> None:
        """``work`` in one transaction with the session's row locked, after adopting the
        session's old values."""
        s = self.schema
        with (
            self._errors("saving moved entries"),
            self._live_pool().connection() as conn,
            conn.transaction(),
        ):
            conn.execute(
                f"INSERT INTO {s}.sessions (session) VALUES (%s) ON CONFLICT DO NOTHING",
                (session,),
            )
            conn.execute(f"SELECT 1 FROM {s}.sessions WHERE session = %s FOR UPDATE", (session,))
            _, forked, count = pg_branches.tip_of(conn, s, session)
            pg_moved.adopt_legacy(conn, s, session, ordinal=count, linear=not forked)
            work(conn)
        self._adopted.add(session)

    def _adopt(self, session: str) -> None:
        """Move the session's old values (if any) to rows, once per process."""
        if session in self._adopted:
            return
        with self._errors("reading"), self._live_pool().connection() as conn:
            found = pg_moved.has_legacy(conn, self.schema, session)
        if found:
            self._write_moved(session, lambda conn: None)
        self._adopted.add(session)

    def _current(self, conn: Any, session: str, within: Chain | None) -> bool:
        """Whether a read of moved entries can use the current rows (the branch is the whole of
        a session that never forked); else it reads the log."""
        if within is not None:
            return within.whole
        return not pg_branches.tip_of(conn, self.schema, session)[1]

    def _holds(self, conn: Any, session: str, within: Chain | None) -> Callable[[int], bool]:
        return (within or pg_branches.chain(conn, self.schema, session, TIP)).holds_ordinal

    def moved_named(
        self, session: str, words: Collection[str], *, within: Chain | None = None
    ) -> list[tuple[str, str]]:
        self._adopt(session)
        with self._errors("reading"), self._live_pool().connection() as conn:
            if self._current(conn, session, within):
                return pg_moved.named_current(conn, self.schema, session, words)
            holds = self._holds(conn, session, within)
            rows = pg_moved.named(conn, self.schema, session, words, holds)
        return [(row.key, str(row.value)) for row in rows]

    def moved_among(
        self, session: str, folded: Collection[str], *, within: Chain | None = None
    ) -> list[str]:
        self._adopt(session)
        with self._errors("reading"), self._live_pool().connection() as conn:
            if self._current(conn, session, within):
                return pg_moved.among_current(conn, self.schema, session, folded)
            holds = self._holds(conn, session, within)
            return [row.key for row in pg_moved.among(conn, self.schema, session, folded, holds)]

    def moved_rows(
        self, session: str, *, within: Chain | None = None
    ) -> Iterator[tuple[str, str | None]]:
        self._adopt(session)
        with self._errors("reading"), self._live_pool().connection() as conn:
            current = self._current(conn, session, within)
            logged = (
                []
                if current
                else pg_moved.every(conn, self.schema, session, self._holds(conn, session, within))
            )
        if not current:
            for row in logged:
                yield row.key, row.value
            return
        last = -1
        while True:
            with self._errors("reading"), self._live_pool().connection() as conn:
                rows = pg_moved.page_current(conn, self.schema, session, last, TURN_PAGE)
            if not rows:
                return
            for key, value, _ in rows:
                yield key, value
            last = rows[-1][2]
