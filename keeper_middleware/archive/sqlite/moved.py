"""The moved STATE entries in SQLite (see ``moved_rows``): a log, and the current rows.

Functions over a connection the caller holds in a transaction, so a cut writes its moved entries
in the cut's own transaction (``SQLiteArchive.commit_cut``). Each change is appended to the log
with the ordinal of the cut that made it; a branch reads, per key, the newest row its chain
holds. A session that never forked also keeps one row per key as of its latest cut (``moved``,
the layout of schema version 2), and a branch at that cut reads those: a cut costs what it cost
before branches, however long the log of keys moved out and back has grown. A session stops
keeping them when it forks (they would be one branch's).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Collection, Sequence
from typing import Any

from keeper_middleware.archive.moved_rows import (
    LEGACY_ENTRIES,
    LEGACY_KEYS,
    LoggedRow,
    MovedRow,
    distinct,
    in_order,
    key_lookup,
    latest_on_chain,
    legacy_rows,
)
from keeper_middleware.archive.records import MovedUpdate

SCHEMA = """
CREATE TABLE moved_log (
    session TEXT NOT NULL REFERENCES sessions(session) ON DELETE CASCADE,
    id INTEGER NOT NULL,
    ordinal INTEGER NOT NULL,
    key TEXT NOT NULL,
    value TEXT,
    gone INTEGER NOT NULL DEFAULT 0,
    place INTEGER NOT NULL,
    folded TEXT NOT NULL,
    word TEXT,
    PRIMARY KEY (session, id)
);
CREATE INDEX moved_log_by_word ON moved_log(session, word);
CREATE INDEX moved_log_by_folded ON moved_log(session, folded);
CREATE INDEX moved_log_by_key ON moved_log(session, key);
"""
"""Schema version 3 (``value`` NULL and not ``gone``: moved, nothing to recall)."""

CURRENT = """
CREATE TABLE moved (
    session TEXT NOT NULL REFERENCES sessions(session) ON DELETE CASCADE,
    key TEXT NOT NULL,
    value TEXT,
    seq INTEGER NOT NULL,
    folded TEXT NOT NULL,
    word TEXT,
    PRIMARY KEY (session, key)
);
CREATE INDEX moved_by_word ON moved(session, word);
CREATE INDEX moved_by_folded ON moved(session, folded);
CREATE INDEX moved_by_seq ON moved(session, seq)
"""
"""The current rows (schema version 2's table, kept as it was)."""

FROM_ROWS = """
INSERT INTO moved_log (session, id, ordinal, key, value, gone, place, folded, word)
SELECT m.session, m.seq + 1, COALESCE(s.cuts, 0), m.key, m.value, 0, m.seq, m.folded, m.word
FROM moved AS m JOIN sessions AS s ON s.session = m.session
"""
"""Version 2 kept one row per key (the latest state): it starts the log as of each session's
latest cut (a checkpoint from before the upgrade sees none of them; docs/branches.md)."""

_IN = "IN (SELECT value FROM json_each(?))"  # any number of keys, one parameter
_COLUMNS = "id, ordinal, key, value, gone, place"
Holds = Callable[[int], bool]


def _logged(row: Sequence[Any]) -> LoggedRow:
    id_, ordinal, key, value, gone, place = row
    return LoggedRow(
        id=int(id_),
        ordinal=int(ordinal),
        key=str(key),
        value=None if value is None else str(value),
        gone=bool(gone),
        place=int(place),
    )


def _current(
    conn: sqlite3.Connection, session: str, where: str, param: object, holds: Holds
) -> dict[str, LoggedRow]:
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM moved_log WHERE session = ? AND {where}", (session, param)
    ).fetchall()
    return latest_on_chain(map(_logged, rows), holds)


def apply(
    conn: sqlite3.Connection,
    session: str,
    update: MovedUpdate,
    *,
    ordinal: int,
    holds: Holds,
) -> None:
    """Append ``update`` as written by the cut ``ordinal`` (the caller holds a write
    transaction and has adopted old values); ``holds`` is the branch before the change."""
    touched = distinct([*update.drop, *update.forget])
    held = _current(conn, session, f"key {_IN}", json.dumps(touched), holds) if touched else {}
    start, place = _next(conn, session)
    rows: list[tuple[str, str | None, int, int]] = []
    for key in distinct(update.drop):
        if key in held:
            rows.append((key, None, 1, held[key].place))
    for key in distinct(update.forget):
        if key in held and key not in update.drop:
            rows.append((key, None, 0, held[key].place))
    for offset, (key, value) in enumerate(update.add):
        rows.append((key, value, 0, place + offset))
    _append(conn, session, ordinal, start, rows)


def apply_linear(
    conn: sqlite3.Connection, session: str, update: MovedUpdate, *, ordinal: int
) -> None:
    """``apply`` in a session that never forked, at its latest cut: the current rows change as
    they always did, and the log gets the same change (with the same places)."""
    touched = distinct([*update.drop, *update.forget])
    held = (
        dict(
            conn.execute(
                f"SELECT key, seq FROM moved WHERE session = ? AND key {_IN}",
                (session, json.dumps(touched)),
            ).fetchall()
        )
        if touched
        else {}
    )
    if update.drop:
        conn.execute(
            f"DELETE FROM moved WHERE session = ? AND key {_IN}",
            (session, json.dumps(distinct(update.drop))),
        )
    if update.forget:
        conn.execute(
            f"UPDATE moved SET value = NULL WHERE session = ? AND key {_IN}",
            (session, json.dumps(distinct(update.forget))),
        )
    place = _upsert_current(conn, session, update.add)
    rows: list[tuple[str, str | None, int, int]] = []
    for key in distinct(update.drop):
        if key in held:
            rows.append((key, None, 1, int(held[key])))
    for key in distinct(update.forget):
        if key in held and key not in update.drop:
            rows.append((key, None, 0, int(held[key])))
    rows += [(key, value, 0, place + i) for i, (key, value) in enumerate(update.add)]
    _append(conn, session, ordinal, _next(conn, session)[0], rows)


def _upsert_current(conn: sqlite3.Connection, session: str, rows: Sequence[MovedRow]) -> int:
    """Upsert ``rows`` into the current rows at the end of the order; returns the first place."""
    start = int(
        conn.execute(
            "SELECT COALESCE(MAX(seq) + 1, 0) FROM moved WHERE session = ?", (session,)
        ).fetchone()[0]
    )
    conn.executemany(
        "INSERT INTO moved (session, key, value, seq, folded, word) VALUES (?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (session, key) DO UPDATE SET value = excluded.value, seq = excluded.seq",
        [(session, key, value, start + i, *key_lookup(key)) for i, (key, value) in enumerate(rows)],
    )
    return start


def named_current(
    conn: sqlite3.Connection, session: str, words: Collection[str]
) -> list[tuple[str, str]]:
    if not words:
        return []
    rows = conn.execute(
        # the planner would walk the session's rows in order (moved_by_seq): every row ever moved
        f"SELECT key, value FROM moved INDEXED BY moved_by_word WHERE session = ? AND word {_IN} "
        "AND value IS NOT NULL ORDER BY seq",
        (session, json.dumps(sorted(words))),
    ).fetchall()
    return [(row[0], row[1]) for row in rows]


def among_current(conn: sqlite3.Connection, session: str, folded: Collection[str]) -> list[str]:
    if not folded:
        return []
    rows = conn.execute(
        f"SELECT key FROM moved INDEXED BY moved_by_folded WHERE session = ? AND folded {_IN} "
        "ORDER BY seq",
        (session, json.dumps(sorted(folded))),
    ).fetchall()
    return [row[0] for row in rows]


def every_current(
    conn: sqlite3.Connection, session: str, after: int, limit: int
) -> list[sqlite3.Row]:
    """A page of current rows in order after ``seq`` ``after``."""
    rows: list[sqlite3.Row] = conn.execute(
        "SELECT key, value, seq FROM moved WHERE session = ? AND seq > ? ORDER BY seq LIMIT ?",
        (session, after, limit),
    ).fetchall()
    return rows


def insert(
    conn: sqlite3.Connection, session: str, rows: Sequence[MovedRow], *, ordinal: int
) -> None:
    """Append ``rows`` at the end of the order (a key moved again moves to the end)."""
    start, place = _next(conn, session)
    _append(
        conn,
        session,
        ordinal,
        start,
        [(key, value, 0, place + i) for i, (key, value) in enumerate(rows)],
    )


def _next(conn: sqlite3.Connection, session: str) -> tuple[int, int]:
    row = conn.execute(
        "SELECT COALESCE(MAX(id) + 1, 1), COALESCE(MAX(place) + 1, 0) FROM moved_log "
        "WHERE session = ?",
        (session,),
    ).fetchone()
    return int(row[0]), int(row[1])


def _append(
    conn: sqlite3.Connection,
    session: str,
    ordinal: int,
    start: int,
    rows: Sequence[tuple[str, str | None, int, int]],
) -> None:
    conn.executemany(
        "INSERT INTO moved_log (session, id, ordinal, key, value, gone, place, folded, word) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (session, start + i, ordinal, key, value, gone, place, *key_lookup(key))
            for i, (key, value, gone, place) in enumerate(rows)
        ],
    )


def adopt_legacy(conn: sqlite3.Connection, session: str, *, ordinal: int, linear: bool) -> bool:
    """Move the first layout's two JSON values of ``session`` into rows (the caller holds a
    write transaction; ``linear``: the session never forked); whether there were any."""
    found = dict(
        conn.execute(
            "SELECT key, value_json FROM kv WHERE session = ? AND key IN (?, ?)",
            (session, LEGACY_KEYS, LEGACY_ENTRIES),
        ).fetchall()
    )
    if not found:
        return False
    rows = legacy_rows(
        json.loads(found.get(LEGACY_KEYS, "null")), json.loads(found.get(LEGACY_ENTRIES, "null"))
    )
    if rows and linear:
        apply_linear(conn, session, MovedUpdate(add=tuple(rows)), ordinal=ordinal)
    elif rows:
        insert(conn, session, rows, ordinal=ordinal)
    conn.execute(
        "DELETE FROM kv WHERE session = ? AND key IN (?, ?)",
        (session, LEGACY_KEYS, LEGACY_ENTRIES),
    )
    return True


def named(
    conn: sqlite3.Connection, session: str, words: Collection[str], holds: Holds
) -> list[LoggedRow]:
    if not words:
        return []
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM moved_log INDEXED BY moved_log_by_word WHERE session = ? "
        f"AND word {_IN}",
        (session, json.dumps(sorted(words))),
    ).fetchall()
    found = latest_on_chain(map(_logged, rows), holds)
    return [row for row in in_order(found) if row.value is not None]


def among(
    conn: sqlite3.Connection, session: str, folded: Collection[str], holds: Holds
) -> list[LoggedRow]:
    if not folded:
        return []
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM moved_log INDEXED BY moved_log_by_folded WHERE session = ? "
        f"AND folded {_IN}",
        (session, json.dumps(sorted(folded))),
    ).fetchall()
    return in_order(latest_on_chain(map(_logged, rows), holds))


def every(conn: sqlite3.Connection, session: str, holds: Holds) -> list[LoggedRow]:
    """Every key still moved on the branch (the whole log of the session is read)."""
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM moved_log WHERE session = ? ORDER BY id", (session,)
    ).fetchall()
    return in_order(latest_on_chain(map(_logged, rows), holds))
