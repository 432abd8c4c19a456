"""A session's tree of cuts in SQLite: the branch of a head, the records a cut finds stored,
the NOTES in effect at a cut, and the search positions of records (docs/branches.md).

Functions over a connection the caller holds (and locks): ``SQLiteArchive`` runs them inside
its own transactions, so a cut reads its branch in the transaction that writes it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Sequence

from keeper_middleware.archive.records import TIP, ArchivedTurn, Chain, Head
from keeper_middleware.archive.rows import NOTES_COLUMNS, CutRow, TreeRow, chain_from
from keeper_middleware.errors import unknown_cut

ID_CHUNK = 500

_TREE = """
WITH RECURSIVE chain(cut_key, parent, ordinal, first_seq, archived) AS (
    SELECT cut_key, parent, ordinal, first_seq, turns_archived FROM cuts
    WHERE session = :session AND cut_key = :head
    UNION ALL
    SELECT c.cut_key, c.parent, c.ordinal, c.first_seq, c.turns_archived
    FROM cuts AS c JOIN chain ON c.session = :session AND c.cut_key = chain.parent
)
SELECT 'cut', ordinal, first_seq, archived FROM chain
UNION ALL
SELECT 'link', chain.ordinal, l.seq, l.place FROM links AS l JOIN chain
    ON l.session = :session AND l.cut_key = chain.cut_key
"""
"""A forked session's branch: its cuts back to the first, and the records they linked."""


def tip_of(conn: sqlite3.Connection, session: str) -> tuple[str | None, bool, int]:
    """The session's latest cut, whether it ever forked, and how many cuts it has."""
    row = conn.execute(
        "SELECT tip, forked, cuts FROM sessions WHERE session = ?", (session,)
    ).fetchone()
    return (None, False, 0) if row is None else (row[0], bool(row[1]), int(row[2]))


def chain(conn: sqlite3.Connection, session: str, head: Head) -> Chain:
    """The branch whose latest cut is ``head`` (``TIP``: the session's latest)."""
    tip, forked, _ = tip_of(conn, session)
    return chain_at(conn, session, tip if head is TIP else head, tip, forked)


def chain_at(
    conn: sqlite3.Connection, session: str, head: str | None, tip: str | None, forked: bool
) -> Chain:
    def read_cut() -> CutRow | None:
        row = conn.execute(
            "SELECT ordinal, first_seq, turns_archived FROM cuts WHERE session = ? AND cut_key = ?",
            (session, head),
        ).fetchone()
        return None if row is None else (int(row[0]), int(row[1]), int(row[2]))

    def read_tree() -> Sequence[TreeRow]:
        rows = conn.execute(_TREE, {"session": session, "head": head}).fetchall()
        return [(str(r[0]), int(r[1]), int(r[2]), int(r[3])) for r in rows]

    return chain_from(
        session,
        head,
        tip=tip,
        forked=forked,
        read_cut=read_cut,
        read_tree=read_tree,
        unknown=lambda: unknown_cut(session, str(head)),
    )


def stored(
    conn: sqlite3.Connection, session: str, turns: Sequence[ArchivedTurn]
) -> dict[tuple[str, str], int]:
    """(msg_id, digest) → seq of the records these turns' ids already have."""
    ids = list(dict.fromkeys(t.msg_id for t in turns))
    found: dict[tuple[str, str], int] = {}
    for start in range(0, len(ids), ID_CHUNK):
        chunk = ids[start : start + ID_CHUNK]
        marks = ", ".join("?" * len(chunk))
        rows = conn.execute(
            f"SELECT msg_id, digest, seq FROM turns WHERE session = ? AND msg_id IN ({marks})",
            (session, *chunk),
        )
        found.update(((row[0], row[1]), int(row[2])) for row in rows)
    return found


def notes_at(conn: sqlite3.Connection, session: str, head: Head) -> sqlite3.Row | None:
    """The row of the NOTES in effect at ``head`` (None: none yet)."""
    if head is None:
        return None
    columns = ", ".join(f"n.{c.strip()}" for c in NOTES_COLUMNS.split(","))
    if head is TIP:
        sql = (
            f"SELECT {columns} FROM sessions AS s JOIN cuts AS c "
            "ON c.session = s.session AND c.cut_key = s.tip JOIN notes AS n "
            "ON n.session = c.session AND n.version = c.notes_at WHERE s.session = ?"
        )
        row = conn.execute(sql, (session,)).fetchone()
    else:
        sql = (
            f"SELECT {columns} FROM cuts AS c JOIN notes AS n "
            "ON n.session = c.session AND n.version = c.notes_at "
            "WHERE c.session = ? AND c.cut_key = ?"
        )
        row = conn.execute(sql, (session, head)).fetchone()
    result: sqlite3.Row | None = row
    return result


def positions(
    conn: sqlite3.Connection, session: str, seqs: Collection[int]
) -> dict[int, int | None]:
    wanted = sorted(set(seqs))
    found: dict[int, int | None] = {}
    for start in range(0, len(wanted), ID_CHUNK):
        chunk = wanted[start : start + ID_CHUNK]
        marks = ", ".join("?" * len(chunk))
        rows = conn.execute(
            f"SELECT seq, position FROM turns WHERE session = ? AND seq IN ({marks})",
            (session, *chunk),
        )
        found.update((int(row[0]), row[1]) for row in rows)
    return found
