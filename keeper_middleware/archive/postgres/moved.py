"""The moved STATE entries in PostgreSQL (see ``moved_rows``): a log, and the current rows.

Functions over a connection the caller holds in a transaction with the session's row locked
(``FOR UPDATE``), so a cut writes its moved entries in its own transaction and two processes
never number rows alike. Keys and values are UTF-8 ``bytea``, like every text the archive keeps
word for word (``text`` cannot hold NUL). Each change is appended to the log (migrations 21-24)
with the ordinal of the cut that made it, and a branch reads, per key, the newest row its chain
holds; a session that never forked also keeps one row per key as of its latest cut (``moved``,
migration 7), which a branch at that cut reads, as before branches (``sqlite.moved`` says why).
"""

from __future__ import annotations

import json
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

_COLUMNS = "id, ordinal, key, value, gone, place"
Holds = Callable[[int], bool]


def _b(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _s(data: bytes | memoryview) -> str:
    return bytes(data).decode("utf-8", "surrogatepass")


def _logged(row: Sequence[Any]) -> LoggedRow:
    id_, ordinal, key, value, gone, place = row
    return LoggedRow(
        id=int(id_),
        ordinal=int(ordinal),
        key=_s(key),
        value=None if value is None else _s(value),
        gone=bool(gone),
        place=int(place),
    )


def _read(conn: Any, schema: str, session: str, where: str, values: list[bytes]) -> list[Any]:
    rows: list[Any] = conn.execute(
        f"SELECT {_COLUMNS} FROM {schema}.moved_log WHERE session = %s AND {where} = ANY(%s)",
        (session, values),
    ).fetchall()
    return rows


def apply(
    conn: Any, schema: str, session: str, update: MovedUpdate, *, ordinal: int, holds: Holds
) -> None:
    """Append ``update`` as written by the cut ``ordinal`` (transaction open, session row
    locked, old values adopted); ``holds`` is the branch before the change."""
    touched = distinct([*update.drop, *update.forget])
    held = (
        latest_on_chain(
            map(_logged, _read(conn, schema, session, "key", [_b(k) for k in touched])), holds
        )
        if touched
        else {}
    )
    start, place = _next(conn, schema, session)
    rows: list[tuple[str, str | None, bool, int]] = []
    for key in distinct(update.drop):
        if key in held:
            rows.append((key, None, True, held[key].place))
    for key in distinct(update.forget):
        if key in held and key not in update.drop:
            rows.append((key, None, False, held[key].place))
    for offset, (key, value) in enumerate(update.add):
        rows.append((key, value, False, place + offset))
    _append(conn, schema, session, ordinal, start, rows)


def apply_linear(
    conn: Any, schema: str, session: str, update: MovedUpdate, *, ordinal: int
) -> None:
    """``apply`` in a session that never forked, at its latest cut: the current rows change as
    they always did, and the log gets the same change (with the same places)."""
    touched = distinct([*update.drop, *update.forget])
    held = (
        {
            _s(key): int(seq)
            for key, seq in conn.execute(
                f"SELECT key, seq FROM {schema}.moved WHERE session = %s AND key = ANY(%s)",
                (session, [_b(key) for key in touched]),
            ).fetchall()
        }
        if touched
        else {}
    )
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
    place = _upsert_current(conn, schema, session, update.add)
    rows: list[tuple[str, str | None, bool, int]] = []
    for key in distinct(update.drop):
        if key in held:
            rows.append((key, None, True, held[key]))
    for key in distinct(update.forget):
        if key in held and key not in update.drop:
            rows.append((key, None, False, held[key]))
    rows += [(key, value, False, place + i) for i, (key, value) in enumerate(update.add)]
    _append(conn, schema, session, ordinal, _next(conn, schema, session)[0], rows)


def _upsert_current(conn: Any, schema: str, session: str, rows: Sequence[MovedRow]) -> int:
    """Upsert ``rows`` into the current rows at the end of the order; the first place."""
    start = int(
        conn.execute(
            f"SELECT COALESCE(MAX(seq) + 1, 0) FROM {schema}.moved WHERE session = %s", (session,)
        ).fetchone()[0]
    )
    if not rows:
        return start
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
    return start


def named_current(
    conn: Any, schema: str, session: str, words: Collection[str]
) -> list[tuple[str, str]]:
    if not words:
        return []
    rows = conn.execute(
        f"SELECT key, value FROM {schema}.moved WHERE session = %s AND word = ANY(%s) "
        "AND value IS NOT NULL ORDER BY seq",
        (session, [_b(word) for word in words]),
    ).fetchall()
    return [(_s(row[0]), _s(row[1])) for row in rows]


def among_current(conn: Any, schema: str, session: str, folded: Collection[str]) -> list[str]:
    if not folded:
        return []
    rows = conn.execute(
        f"SELECT key FROM {schema}.moved WHERE session = %s AND folded = ANY(%s) ORDER BY seq",
        (session, [_b(name) for name in folded]),
    ).fetchall()
    return [_s(row[0]) for row in rows]


def page_current(
    conn: Any, schema: str, session: str, after: int, limit: int
) -> list[tuple[Any, ...]]:
    """A page of current (key, value, seq) in order after ``seq`` ``after``."""
    rows: list[tuple[Any, ...]] = conn.execute(
        f"SELECT key, value, seq FROM {schema}.moved WHERE session = %s AND seq > %s "
        "ORDER BY seq LIMIT %s",
        (session, after, limit),
    ).fetchall()
    return [(_s(key), None if value is None else _s(value), seq) for key, value, seq in rows]


def insert(conn: Any, schema: str, session: str, rows: Sequence[MovedRow], *, ordinal: int) -> None:
    """Append ``rows`` at the end of the order (a key moved again moves to the end)."""
    start, place = _next(conn, schema, session)
    _append(
        conn,
        schema,
        session,
        ordinal,
        start,
        [(key, value, False, place + i) for i, (key, value) in enumerate(rows)],
    )


def _next(conn: Any, schema: str, session: str) -> tuple[int, int]:
    row = conn.execute(
        f"SELECT COALESCE(MAX(id) + 1, 1), COALESCE(MAX(place) + 1, 0) FROM {schema}.moved_log "
        "WHERE session = %s",
        (session,),
    ).fetchone()
    return int(row[0]), int(row[1])


def _append(
    conn: Any,
    schema: str,
    session: str,
    ordinal: int,
    start: int,
    rows: Sequence[tuple[str, str | None, bool, int]],
) -> None:
    if not rows:
        return
    params = []
    for i, (key, value, gone, place) in enumerate(rows):
        folded, word = key_lookup(key)
        params.append(
            (
                session,
                start + i,
                ordinal,
                _b(key),
                None if value is None else _b(value),
                gone,
                place,
                _b(folded),
                None if word is None else _b(word),
            )
        )
    with conn.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {schema}.moved_log (session, id, ordinal, key, value, gone, place, "
            "folded, word) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            params,
        )


def adopt_legacy(conn: Any, schema: str, session: str, *, ordinal: int, linear: bool) -> bool:
    """Move the first layout's two JSON values of ``session`` into rows (transaction open,
    session row locked; ``linear``: the session never forked); whether there were any."""
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
    if rows and linear:
        apply_linear(conn, schema, session, MovedUpdate(add=tuple(rows)), ordinal=ordinal)
    elif rows:
        insert(conn, schema, session, rows, ordinal=ordinal)
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


def named(
    conn: Any, schema: str, session: str, words: Collection[str], holds: Holds
) -> list[LoggedRow]:
    if not words:
        return []
    rows = _read(conn, schema, session, "word", [_b(word) for word in words])
    found = latest_on_chain(map(_logged, rows), holds)
    return [row for row in in_order(found) if row.value is not None]


def among(
    conn: Any, schema: str, session: str, folded: Collection[str], holds: Holds
) -> list[LoggedRow]:
    if not folded:
        return []
    rows = _read(conn, schema, session, "folded", [_b(name) for name in folded])
    return in_order(latest_on_chain(map(_logged, rows), holds))


def every(conn: Any, schema: str, session: str, holds: Holds) -> list[LoggedRow]:
    """Every key still moved on the branch (the whole log of the session is read)."""
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM {schema}.moved_log WHERE session = %s ORDER BY id", (session,)
    ).fetchall()
    return in_order(latest_on_chain(map(_logged, rows), holds))
