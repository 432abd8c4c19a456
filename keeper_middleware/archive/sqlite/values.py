"""Per-session values in the SQLite archive: how a batch of them is written.

A proxy writes its session's values at every request (the record's new piece, its head, the
counters): that write is most of what saving a session costs, and the commit is most of that.
A batch that only upserts, for a session whose row is known to be there, is one multi-row
``INSERT ... ON CONFLICT`` statement: SQLite runs a statement outside a transaction as a
transaction of its own, all or none, so it is as atomic as ``BEGIN`` / upserts / ``COMMIT``
at a third of the calls. A batch that also deletes keys (a record retiring old chunks), or
that may have to write the session's row first, runs as one explicit transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from functools import cache
from itertools import chain
from typing import Any

from keeper_middleware.archive.json_text import value_text
from keeper_middleware.errors import ArgumentTypeError
from keeper_middleware.messages.facts import storable_text

__all__ = ["UPSERT_VALUE", "value_rows", "write_values"]

UPSERT_VALUE = (
    "INSERT INTO kv (session, key, value_json) VALUES (?, ?, ?) "
    "ON CONFLICT (session, key) DO UPDATE SET value_json = excluded.value_json"
)
_ONE_STATEMENT = 64
"""The most rows written as one statement (3 parameters each, far below SQLite's limit)."""
_ADD_SESSION = "INSERT OR IGNORE INTO sessions (session) VALUES (?)"


def value_rows(session: str, values: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(session, key, JSON) rows of per-session values.

    Raises:
        ArgumentTypeError: a value is not JSON-able (the message names its key).
    """
    rows = []
    for key, value in values.items():
        try:
            # a lone surrogate cannot be stored as UTF-8: keep it as its JSON escape
            value_json = storable_text(value_text(value))
        except (TypeError, ValueError) as exc:
            raise ArgumentTypeError(
                f"value for {key!r} must be JSON-able (dict, list, str, number, bool, None): {exc}"
            ) from exc
        rows.append((session, key, value_json))
    return rows


@cache
def _upsert_rows(count: int) -> str:
    """One statement upserting ``count`` rows, in their order."""
    return (
        "INSERT INTO kv (session, key, value_json) VALUES "
        + ", ".join(["(?, ?, ?)"] * count)
        + " ON CONFLICT (session, key) DO UPDATE SET value_json = excluded.value_json"
    )


def write_values(
    conn: sqlite3.Connection,
    session: str,
    rows: Sequence[tuple[str, str, str]],
    gone: Sequence[tuple[str, str]],
    *,
    present: bool,
) -> None:
    """Upsert ``rows`` and delete the keys ``gone`` of ``session``, all or none.

    Args:
        conn: the archive's connection, outside a transaction (its lock held by the caller;
            inside one, the batch is refused as ``BEGIN`` refuses it, never joined to it).
        session: whose values these are.
        rows: (session, key, JSON) rows to upsert, in order.
        gone: (session, key) pairs to delete.
        present: whether the session's row is known to exist (else it is written first; one
            erased meanwhile by another process is written again on the refusal).

    Raises:
        ArchiveError: the file failed (the write is rolled back whole).
    """
    if present and rows and not gone and len(rows) <= _ONE_STATEMENT and not conn.in_transaction:
        try:
            conn.execute(_upsert_rows(len(rows)), list(chain.from_iterable(rows)))
            return
        except sqlite3.IntegrityError:  # the session's row was erased since: nothing written
            present = False
    conn.execute("BEGIN IMMEDIATE")
    try:
        if not present:
            conn.execute(_ADD_SESSION, (session,))
        try:
            conn.executemany(UPSERT_VALUE, rows)
        except sqlite3.IntegrityError:  # erased by another process since: write it again
            conn.execute(_ADD_SESSION, (session,))
            conn.executemany(UPSERT_VALUE, rows)
        if gone:
            conn.executemany("DELETE FROM kv WHERE session = ? AND key = ?", gone)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
