"""Reading a PostgreSQL archive's turns, cuts and NOTES (a mixin of
:class:`~keeper_middleware.archive.postgres.archive.PostgresArchive`).

Every read pages by its key with a pooled connection per page (no cursor or connection is held
between pages), and a branch's records are read run by run in its own order.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

from keeper_middleware.archive.postgres import branches as pg_branches
from keeper_middleware.archive.postgres.rows import cut_from_row, notes_from_row, turn_from_row
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

__all__ = ["TURN_PAGE", "PostgresReads"]

_T = TypeVar("_T")
TURN_PAGE = 256
"""Rows a page of turns, cuts or moved entries."""
_NOTES_PAGE = 8


class PostgresReads:
    """The archive's reads (mixed into ``PostgresArchive``, which opens the pool and names the
    schema)."""

    schema: str

    if TYPE_CHECKING:

        def _errors(self, doing: str) -> AbstractContextManager[Any]: ...

        def _live_pool(self) -> Any: ...

    def _query(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        with self._errors("reading"), self._live_pool().connection() as conn:
            rows: list[tuple[Any, ...]] = conn.execute(sql, params).fetchall()
            return rows

    def find_cut(self, session: str, cut_key: str) -> CutRecord | None:
        rows = self._query(
            f"SELECT {CUT_COLUMNS} FROM {self.schema}.cuts WHERE session = %s AND cut_key = %s",
            (session, cut_key),
        )
        return cut_from_row(rows[0]) if rows else None

    def cuts(self, session: str, *, after: int = 0) -> Iterator[CutRecord]:
        sql = (
            f"SELECT {CUT_COLUMNS} FROM {self.schema}.cuts WHERE session = %s AND ordinal > %s "
            f"ORDER BY ordinal LIMIT {TURN_PAGE}"
        )
        return self._pages(sql, lambda last: (session, last), after, 6, cut_from_row)

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
        where = "session = %s AND seq > %s"
        bounds: list[Any] = []
        if from_item is not None:
            where, bounds = where + " AND item >= %s", [*bounds, from_item]
        if to_item is not None:
            where, bounds = where + " AND item <= %s", [*bounds, to_item]
        sql = (
            f"SELECT {TURN_COLUMNS} FROM {self.schema}.turns WHERE {where} "
            f"ORDER BY seq LIMIT {TURN_PAGE}"
        )
        if within is None or within.whole:
            return self._pages(
                sql, lambda last: (session, last, *bounds), after_seq, 9, turn_from_row
            )
        return self._walk(where, session, bounds, after_seq, within)

    def _walk(
        self, where: str, session: str, bounds: list[Any], after_seq: int, within: Chain
    ) -> Iterator[ArchivedTurn]:
        """The records a branch sees, in its own order: each run of its records read in turn."""
        sql = (
            f"SELECT {TURN_COLUMNS} FROM {self.schema}.turns WHERE {where} AND seq < %s "
            f"ORDER BY seq LIMIT {TURN_PAGE}"
        )
        for start, end in within.seqs.walk:

            def params(last: int, end: int = end) -> tuple[Any, ...]:
                return (session, last, *bounds, end)

            yield from self._pages(
                sql,
                params,
                max(after_seq, start - 1),
                9,
                turn_from_row,
            )

    def _pages(
        self,
        sql: str,
        params: Callable[[int], Sequence[Any]],
        start: int,
        key: int,
        make: Callable[[Sequence[Any]], _T],
    ) -> Iterator[_T]:
        """Keyset paging: no cursor or connection is held between pages."""
        self._live_pool()
        last = start
        while rows := self._query(sql, params(last)):
            yield from map(make, rows)
            last = rows[-1][key]

    def turn(
        self, session: str, msg_id: str, *, within: Chain | None = None
    ) -> ArchivedTurn | None:
        rows = self._query(
            f"SELECT {TURN_COLUMNS} FROM {self.schema}.turns WHERE session = %s AND msg_id = %s "
            "ORDER BY seq DESC",
            (session, msg_id),
        )
        seen = [row for row in rows if within is None or within.sees(int(row[9]))]
        if not seen:
            return None
        if within is None:
            return turn_from_row(seen[0])
        return turn_from_row(max(seen, key=lambda row: within.rank(int(row[9]))))

    def turn_count(self, session: str) -> int:
        rows = self._query(
            f"SELECT next_seq FROM {self.schema}.sessions WHERE session = %s", (session,)
        )
        return int(rows[0][0]) if rows else 0

    def positions(self, session: str, seqs: Collection[int]) -> dict[int, int | None]:
        with self._errors("reading"), self._live_pool().connection() as conn:
            return pg_branches.positions(conn, self.schema, session, seqs)

    def latest_notes(self, session: str) -> NotesVersion | None:
        return self.notes_at(session, TIP)

    def notes_at(self, session: str, head: Head = TIP) -> NotesVersion | None:
        if head is None:  # no cut yet on the branch: no NOTES, nothing to read
            self._live_pool()
            return None
        with self._errors("reading"), self._live_pool().connection() as conn:
            row = pg_branches.notes_at(conn, self.schema, session, head)
        return None if row is None else notes_from_row(row)

    def notes_versions(self, session: str) -> Iterator[NotesVersion]:
        """Every saved version, oldest first, a few at a time (they add up to gigabytes)."""
        sql = (
            f"SELECT {NOTES_COLUMNS} FROM {self.schema}.notes WHERE session = %s "
            f"AND version > %s ORDER BY version LIMIT {_NOTES_PAGE}"
        )
        return self._pages(sql, lambda last: (session, last), 0, 1, notes_from_row)
