"""The handles table of a PostgreSQL archive (``archive.handles``): its two statements (the
table is a migration of ``schema``)."""

from __future__ import annotations

import json
import time
from typing import Any

from keeper_middleware.errors import ArchiveError

__all__ = ["find", "put"]


def put(conn: Any, schema: str, session: str, handle: str, value_json: str) -> None:
    """Insert the handle (in the caller's transaction), its session's row first."""
    conn.execute(
        f"INSERT INTO {schema}.sessions (session) VALUES (%s) ON CONFLICT DO NOTHING", (session,)
    )
    cursor = conn.execute(
        f"INSERT INTO {schema}.handles (handle, session, value_json, created) "
        "VALUES (%s, %s, %s, %s) ON CONFLICT (handle) DO NOTHING",
        (handle, session, value_json, time.time()),
    )
    if cursor.rowcount == 0:
        raise ArchiveError(f"the handle {handle[:40]!r} is already taken")


def find(conn: Any, schema: str, handle: str) -> tuple[str, Any] | None:
    row = conn.execute(
        f"SELECT session, value_json FROM {schema}.handles WHERE handle = %s", (handle,)
    ).fetchone()
    return None if row is None else (str(row[0]), json.loads(row[1]))
