"""The moved STATE entries in SQLite: one row per entry (see ``moved_rows``).

Functions over a connection the caller holds in a transaction, so a cut writes its moved entries
in the cut's own transaction (``SQLiteArchive.commit_cut``).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Collection, Sequence

from keeper_middleware.archive.records import MovedUpdate
from keeper_middleware.moved_rows import (
    LEGACY_ENTRIES,
    LEGACY_KEYS,
    MovedRow,
    distinct,
    key_lookup,
    legacy_rows,
)

SCHEMA = """
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
CREATE INDEX moved_by_seq ON moved(session, seq);
"""
"""Added in schema version 2 (``value`` NULL: moved, nothing to recall)."""

_IN = "IN (SELECT value FROM json_each(?))"  # any number of keys, one parameter


def apply(conn: sqlite3.Connection, session: str, update: MovedUpdate) -> None:
    """Apply ``update`` (the caller holds a write transaction and has adopted old values)."""
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
    if update.add:
        insert(conn, session, update.add)


def insert(conn: sqlite3.Connection, session: str, rows: Sequence[MovedRow]) -> None:
    """Upsert ``rows`` at the end of the session's order (a key moved again moves to the end)."""
    start = conn.execute(
        "SELECT COALESCE(MAX(seq) + 1, 0) FROM moved WHERE session = ?", (session,)
    ).fetchone()[0]
    conn.executemany(
        "INSERT INTO moved (session, key, value, seq, folded, word) VALUES (?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (session, key) DO UPDATE SET value = excluded.value, seq = excluded.seq",
        [(session, key, value, start + i, *key_lookup(key)) for i, (key, value) in enumerate(rows)],
    )


def adopt_legacy(conn: sqlite3.Connection, session: str) -> bool:
    """Move the old layout's two JSON values of ``session`` into rows (the caller holds a write
    transaction); whether there were any."""
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
    if rows:
        insert(conn, session, rows)
    conn.execute(
        "DELETE FROM kv WHERE session = ? AND key IN (?, ?)",
        (session, LEGACY_KEYS, LEGACY_ENTRIES),
    )
    return True


def named(conn: sqlite3.Connection, session: str, words: Collection[str]) -> list[tuple[str, str]]:
    if not words:
        return []
    rows = conn.execute(
        # the planner would walk the session's rows in order (moved_by_seq): every row ever moved
        f"SELECT key, value FROM moved INDEXED BY moved_by_word WHERE session = ? AND word {_IN} "
        "AND value IS NOT NULL ORDER BY seq",
        (session, json.dumps(sorted(words))),
    ).fetchall()
    return [(row[0], row[1]) for row in rows]


def among(conn: sqlite3.Connection, session: str, folded: Collection[str]) -> list[str]:
    if not folded:
        return []
    rows = conn.execute(
        f"SELECT key FROM moved INDEXED BY moved_by_folded WHERE session = ? AND folded {_IN} "
        "ORDER BY seq",
        (session, json.dumps(sorted(folded))),
    ).fetchall()
    return [row[0] for row in rows]


def every(conn: sqlite3.Connection, session: str, after: int, limit: int) -> list[sqlite3.Row]:
    """A page of rows in order after ``seq`` ``after``."""
    return conn.execute(
        "SELECT key, value, seq FROM moved WHERE session = ? AND seq > ? ORDER BY seq LIMIT ?",
        (session, after, limit),
    ).fetchall()
