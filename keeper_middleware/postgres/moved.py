"""The moved STATE entries in PostgreSQL: one row per entry (see ``moved_rows``).

Functions over a connection the caller holds in a transaction with the session's row locked
(``FOR UPDATE``), so a cut writes its moved entries in its own transaction and two processes
never number rows alike. Keys and values are UTF-8 ``bytea``, like every text the archive keeps
word for word (``text`` cannot hold NUL). The table is the archive's migration 7 (``schema``).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Any

from keeper_middleware.archive.records import MovedUpdate
from keeper_middleware.moved_rows import (
    LEGACY_ENTRIES,
    LEGACY_KEYS,
    MovedRow,
    distinct,
    key_lookup,
    legacy_rows,
)


def _b(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _s(data: bytes | memoryview) -> str:
    return bytes(data).decode("utf-8", "surrogatepass")


def apply(conn: Any, schema: str, session: str, update: MovedUpdate) -> None:
    """Apply ``update`` (transaction open, session row locked, old values adopted)."""
    if update.drop:
        conn.execute(
            f"DELETE FROM {schema}.moved WHERE session = %s AND key = ANY(%s)",
            (session, [_b(key) for key in distinct(update.drop)]),
        )
    if update.forget:
        conn.execute(
            f"UPDATE {schema}.moved SET value = NULL WHERE session = %s AND key = ANY(%s)",
            (session, [_b(key) for key in distinct(update.forget)]),
        )
    if update.add:
        insert(conn, schema, session, update.add)


def insert(conn: Any, schema: str, session: str, rows: Sequence[MovedRow]) -> None:
    """Upsert ``rows`` at the end of the session's order (a key moved again moves to the end)."""
    start = conn.execute(
        f"SELECT COALESCE(MAX(seq) + 1, 0) FROM {schema}.moved WHERE session = %s", (session,)
    ).fetchone()[0]
    params = []
    for i, (key, value) in enumerate(rows):
        folded, word = key_lookup(key)
        params.append(
            (
                session,
                _b(key),
                None if value is None else _b(value),
                start + i,
                _b(folded),
                None if word is None else _b(word),
            )
        )
    with conn.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {schema}.moved (session, key, value, seq, folded, word) "
            "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (session, key) "
            "DO UPDATE SET value = excluded.value, seq = excluded.seq",
            params,
        )


def adopt_legacy(conn: Any, schema: str, session: str) -> bool:
    """Move the old layout's two JSON values of ``session`` into rows (transaction open, session
    row locked); whether there were any."""
    found = dict(
        conn.execute(
            f"SELECT key, value_json FROM {schema}.kv WHERE session = %s AND key = ANY(%s)",
            (session, [LEGACY_KEYS, LEGACY_ENTRIES]),
        ).fetchall()
    )
    if not found:
        return False
    rows = legacy_rows(
        json.loads(found.get(LEGACY_KEYS, "null")), json.loads(found.get(LEGACY_ENTRIES, "null"))
    )
    if rows:
        insert(conn, schema, session, rows)
    conn.execute(
        f"DELETE FROM {schema}.kv WHERE session = %s AND key = ANY(%s)",
        (session, [LEGACY_KEYS, LEGACY_ENTRIES]),
    )
    return True


def has_legacy(conn: Any, schema: str, session: str) -> bool:
    row = conn.execute(
        f"SELECT 1 FROM {schema}.kv WHERE session = %s AND key = ANY(%s) LIMIT 1",
        (session, [LEGACY_KEYS, LEGACY_ENTRIES]),
    ).fetchone()
    return row is not None


def named(conn: Any, schema: str, session: str, words: Collection[str]) -> list[tuple[str, str]]:
    if not words:
        return []
    rows = conn.execute(
        f"SELECT key, value FROM {schema}.moved WHERE session = %s AND word = ANY(%s) "
        "AND value IS NOT NULL ORDER BY seq",
        (session, [_b(word) for word in words]),
    ).fetchall()
    return [(_s(row[0]), _s(row[1])) for row in rows]


def among(conn: Any, schema: str, session: str, folded: Collection[str]) -> list[str]:
    if not folded:
        return []
    rows = conn.execute(
        f"SELECT key FROM {schema}.moved WHERE session = %s AND folded = ANY(%s) ORDER BY seq",
        (session, [_b(name) for name in folded]),
    ).fetchall()
    return [_s(row[0]) for row in rows]


def page(conn: Any, schema: str, session: str, after: int, limit: int) -> list[tuple[Any, ...]]:
    """A page of (key, value, seq) in order after ``seq`` ``after``."""
    rows: list[tuple[Any, ...]] = conn.execute(
        f"SELECT key, value, seq FROM {schema}.moved WHERE session = %s AND seq > %s "
        "ORDER BY seq LIMIT %s",
        (session, after, limit),
    ).fetchall()
    return [(_s(key), None if value is None else _s(value), seq) for key, value, seq in rows]
