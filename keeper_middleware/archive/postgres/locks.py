"""Session locks held by the PostgreSQL server, for ``SessionLockBackend``.

A session-level advisory lock per session, taken with ``pg_try_advisory_lock`` on one connection
per process, so any number of sessions can be held at once without a connection each, and a
process that dies releases its locks with its connection.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any

from keeper_middleware.archive.postgres.connect import connect, require_psycopg, translated_errors

_LOCK_CLASS = 0x6B707273  # the advisory key space of session locks: (class, hash of session)


def session_lock_key(schema: str, session: str) -> int:
    """The advisory lock key of a session: a signed 32-bit hash of the schema and the session.

    Two sessions that share a key only wait for each other; they never run at once wrongly.
    """
    digest = hashlib.blake2b(f"{schema}\x00{session}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big", signed=True)


class AdvisoryLocks:
    """The advisory locks of one archive (``schema``) on one connection of this process, opened
    at the first lock and again after the server dropped it."""

    def __init__(self, url: str, schema: str, *, timeout: float) -> None:
        self.url = url
        self.schema = schema
        self.timeout = timeout
        self._conn: Any = None
        self._mutex = threading.Lock()

    def try_lock(self, session: str) -> bool:
        """Take the session's lock if no process holds it (without waiting)."""
        key = session_lock_key(self.schema, session)
        with self._mutex, translated_errors(self.url, "locking a session"):
            if self._conn is None or self._conn.closed:
                self._conn = connect(self.url, timeout=self.timeout)
            row = self._conn.execute(
                "SELECT pg_try_advisory_lock(%s, %s)", (_LOCK_CLASS, key)
            ).fetchone()
            return bool(row[0])

    def unlock(self, session: str) -> None:
        key = session_lock_key(self.schema, session)
        with self._mutex:
            conn = self._conn
            if conn is None or conn.closed:
                return  # the server released every lock of that connection when it went
            psycopg = require_psycopg()
            try:
                conn.execute("SELECT pg_advisory_unlock(%s, %s)", (_LOCK_CLASS, key))
            except psycopg.OperationalError:
                conn.close()

    def close(self) -> None:
        with self._mutex:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
