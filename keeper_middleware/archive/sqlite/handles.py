"""The handles table of an SQLite archive (``archive.handles``): its schema and its two
statements. Added in layout version 4."""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

from keeper_middleware.errors import ArchiveError

__all__ = ["SCHEMA", "find", "put"]

SCHEMA = """
CREATE TABLE handles (
    handle TEXT PRIMARY KEY,
    session TEXT NOT NULL REFERENCES sessions(session) ON DELETE CASCADE,
    value_json TEXT NOT NULL,
    created REAL NOT NULL
)
"""


def put(conn: sqlite3.Connection, session: str, handle: str, value_json: str) -> None:
    """Insert the handle (in the caller's transaction), its session's row first."""
    conn.execute("INSERT OR IGNORE INTO sessions (session) VALUES (?)", (session,))
    cursor = conn.execute(
        "INSERT INTO handles (handle, session, value_json, created) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (handle) DO NOTHING",
        (handle, session, value_json, time.time()),
    )
    if cursor.rowcount == 0:
        raise ArchiveError(f"the handle {handle[:40]!r} is already taken")


def find(conn: sqlite3.Connection, handle: str) -> tuple[str, Any] | None:
    row = conn.execute(
        "SELECT session, value_json FROM handles WHERE handle = ?", (handle,)
    ).fetchone()
    return None if row is None else (str(row[0]), json.loads(row[1]))
