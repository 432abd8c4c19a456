"""A session's tree of cuts in PostgreSQL: the branch of a head, the records a cut finds stored,
the NOTES in effect at a cut, and the search positions of records (docs/branches.md).

Functions over a connection the caller holds: ``PostgresArchive`` runs them inside its own
transactions (a cut reads its branch with the session's row locked, in the transaction that
writes it).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from keeper_middleware.archive.records import TIP, ArchivedTurn, Chain, Head
from keeper_middleware.archive.rows import NOTES_COLUMNS, CutRow, TreeRow, chain_from
from keeper_middleware.errors import unknown_cut

_TREE = """
WITH RECURSIVE chain(cut_key, parent, ordinal, first_seq, archived) AS (
    SELECT cut_key, parent, ordinal, first_seq, turns_archived FROM {schema}.cuts
    WHERE session = %(session)s AND cut_key = %(head)s
    UNION ALL
    SELECT c.cut_key, c.parent, c.ordinal, c.first_seq, c.turns_archived
    FROM {schema}.cuts AS c JOIN chain ON c.session = %(session)s AND c.cut_key = chain.parent
)
SELECT 'cut', ordinal, first_seq, archived FROM chain
UNION ALL
SELECT 'link', chain.ordinal, l.seq, l.place FROM {schema}.links AS l JOIN chain
    ON l.session = %(session)s AND l.cut_key = chain.cut_key
"""
"""A forked session's branch: its cuts back to the first, and the records they linked."""


def tip_of(conn: Any, schema: str, session: str) -> tuple[str | None, bool, int]:
    """The session's latest cut, whether it ever forked, and how many cuts it has."""
    row = conn.execute(
        f"SELECT tip, forked, cuts FROM {schema}.sessions WHERE session = %s", (session,)
    ).fetchone()
    return (None, False, 0) if row is None else (row[0], bool(row[1]), int(row[2]))


def chain(conn: Any, schema: str, session: str, head: Head) -> Chain:
    """The branch whose latest cut is ``head`` (``TIP``: the session's latest)."""
    tip, forked, _ = tip_of(conn, schema, session)
    return chain_at(conn, schema, session, tip if head is TIP else head, tip, forked)


def chain_at(
    conn: Any, schema: str, session: str, head: str | None, tip: str | None, forked: bool
) -> Chain:
    def read_cut() -> CutRow | None:
        row = conn.execute(
            f"SELECT ordinal, first_seq, turns_archived FROM {schema}.cuts "
            "WHERE session = %s AND cut_key = %s",
            (session, head),
        ).fetchone()
        return None if row is None else (int(row[0]), int(row[1]), int(row[2]))

    def read_tree() -> Sequence[TreeRow]:
        rows = conn.execute(
            _TREE.format(schema=schema), {"session": session, "head": head}
        ).fetchall()
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
    conn: Any, schema: str, session: str, turns: Sequence[ArchivedTurn]
) -> dict[tuple[str, str], int]:
    """(msg_id, digest) → seq of the records these turns' ids already have."""
    ids = list(dict.fromkeys(t.msg_id for t in turns))
    if not ids:
        return {}
    rows = conn.execute(
        f"SELECT msg_id, digest, seq FROM {schema}.turns WHERE session = %s AND msg_id = ANY(%s)",
        (session, ids),
    )
    return {(row[0], row[1]): int(row[2]) for row in rows}


def notes_at(conn: Any, schema: str, session: str, head: Head) -> tuple[Any, ...] | None:
    """The row of the NOTES in effect at ``head`` (None: none yet)."""
    if head is None:
        return None
    columns = ", ".join(f"n.{c.strip()}" for c in NOTES_COLUMNS.split(","))
    if head is TIP:
        row = conn.execute(
            f"SELECT {columns} FROM {schema}.sessions AS x JOIN {schema}.cuts AS c "
            f"ON c.session = x.session AND c.cut_key = x.tip JOIN {schema}.notes AS n "
            "ON n.session = c.session AND n.version = c.notes_at WHERE x.session = %s",
            (session,),
        ).fetchone()
    else:
        row = conn.execute(
            f"SELECT {columns} FROM {schema}.cuts AS c JOIN {schema}.notes AS n "
            "ON n.session = c.session AND n.version = c.notes_at "
            "WHERE c.session = %s AND c.cut_key = %s",
            (session, head),
        ).fetchone()
    result: tuple[Any, ...] | None = row
    return result


def positions(conn: Any, schema: str, session: str, seqs: Collection[int]) -> dict[int, int | None]:
    wanted = sorted(set(seqs))
    if not wanted:
        return {}
    rows = conn.execute(
        f"SELECT seq, position FROM {schema}.turns WHERE session = %s AND seq = ANY(%s)",
        (session, wanted),
    ).fetchall()
    return {int(row[0]): None if row[1] is None else int(row[1]) for row in rows}


def set_positions(
    conn: Any, schema: str, session: str, positions: Sequence[tuple[int, int]]
) -> None:
    with conn.cursor() as cursor:
        cursor.executemany(
            f"UPDATE {schema}.turns SET position = %s WHERE session = %s AND seq = %s",
            [(position, session, seq) for seq, position in positions],
        )
