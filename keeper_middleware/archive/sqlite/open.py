"""Opening an SQLite archive file: the path checked, the tables created or migrated forward,
the file proven writable, and every failure explained with the fix.

Kept apart from ``archive`` so the backend's transactions read without the file's setup;
the moved entries' log is ``moved``'s. Version 3 (branches, docs/branches.md) names records by
message id and digest, chains cuts to their parents and keeps moved entries as a log; version 4
adds the handles table (``archive.handles``). A file of an earlier version is brought forward
when opened, in one transaction.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Literal

from keeper_middleware.archive.records import turn_digest
from keeper_middleware.archive.schema_version import SCHEMA_VERSION
from keeper_middleware.archive.sqlite import handles as sqlite_handles
from keeper_middleware.archive.sqlite import moved as sqlite_moved
from keeper_middleware.errors import ArchiveError, ArchiveSchemaError
from keeper_middleware.errors.sqlite import FileConnection, describe

_TURNS = """
CREATE TABLE {name} (
    session TEXT NOT NULL,
    seq INTEGER NOT NULL,
    msg_id TEXT NOT NULL,
    digest TEXT NOT NULL,
    item INTEGER,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    tool_calls_json TEXT NOT NULL,
    tool_call_id TEXT,
    name TEXT,
    reasoning TEXT NOT NULL,
    cut_key TEXT NOT NULL,
    position INTEGER,
    PRIMARY KEY (session, seq),
    UNIQUE (session, msg_id, digest),
    FOREIGN KEY (session, cut_key) REFERENCES cuts(session, cut_key) ON DELETE CASCADE
)
"""
"""A record: ``position`` is its first search passage's (``indexing.catch_up``), NULL until
indexed (or indexed before version 3: ``indexing.ensure_positions`` works them out)."""

_BRANCHES = """
CREATE INDEX turns_by_item ON turns(session, item, seq);
CREATE INDEX cuts_by_ordinal ON cuts(session, ordinal);
CREATE TABLE links (
    session TEXT NOT NULL,
    cut_key TEXT NOT NULL,
    seq INTEGER NOT NULL,
    place INTEGER NOT NULL,
    PRIMARY KEY (session, cut_key, seq),
    FOREIGN KEY (session, cut_key) REFERENCES cuts(session, cut_key) ON DELETE CASCADE
)
"""
"""A cut's links to records another branch archived first (``place``: where the record stands
among the records the cut brings onto its branch)."""

_SCHEMA = (
    """
CREATE TABLE sessions (
    session TEXT PRIMARY KEY,
    tip TEXT,
    forked INTEGER NOT NULL DEFAULT 0,
    cuts INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE cuts (
    session TEXT NOT NULL REFERENCES sessions(session) ON DELETE CASCADE,
    cut_key TEXT NOT NULL,
    turns_archived INTEGER NOT NULL,
    notes_version INTEGER,
    created REAL NOT NULL,
    parent TEXT,
    ordinal INTEGER NOT NULL DEFAULT 0,
    first_seq INTEGER NOT NULL DEFAULT 0,
    notes_at INTEGER,
    PRIMARY KEY (session, cut_key)
);
"""
    + _TURNS.format(name="turns")
    + ";"
    + _BRANCHES
    + """;
CREATE TABLE notes (
    session TEXT NOT NULL,
    version INTEGER NOT NULL,
    first_item INTEGER,
    last_item INTEGER,
    text TEXT NOT NULL,
    data_json TEXT NOT NULL,
    cut_key TEXT NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (session, version),
    FOREIGN KEY (session, cut_key) REFERENCES cuts(session, cut_key) ON DELETE CASCADE
);
CREATE TABLE kv (
    session TEXT NOT NULL REFERENCES sessions(session) ON DELETE CASCADE,
    key TEXT NOT NULL,
    value_json TEXT NOT NULL,
    PRIMARY KEY (session, key)
);
"""
)

_TO_V3 = (
    """
ALTER TABLE sessions ADD COLUMN tip TEXT;
ALTER TABLE sessions ADD COLUMN forked INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN cuts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE cuts ADD COLUMN parent TEXT;
ALTER TABLE cuts ADD COLUMN ordinal INTEGER NOT NULL DEFAULT 0;
ALTER TABLE cuts ADD COLUMN first_seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE cuts ADD COLUMN notes_at INTEGER;
"""
    + _TURNS.format(name="turns_v3")
    + """;
INSERT INTO turns_v3 (session, seq, msg_id, digest, item, role, content, tool_calls_json,
    tool_call_id, name, reasoning, cut_key)
SELECT session, seq, msg_id,
    keeper_digest(item, role, content, tool_calls_json, tool_call_id, name, reasoning),
    item, role, content, tool_calls_json, tool_call_id, name, reasoning, cut_key
FROM turns;
DROP TABLE turns;
ALTER TABLE turns_v3 RENAME TO turns;
"""
    + _BRANCHES
)
"""Version 2 to 3: the turns table is rebuilt with each record's digest (its id alone no longer
names it); cuts get their place in a chain (``_chain_cuts``)."""


def open_archive_file(
    path: str,
    *,
    timeout: float,
    synchronous: Literal["NORMAL", "FULL"],
    check: Literal["quick", "full", "off"] = "quick",
) -> FileConnection:
    """A connection to the archive at ``path`` (or ``":memory:"``), its tables current and its
    pages checked, or an ``ArchiveError`` that says why not.

    The connection fails as ``ArchiveError``s from then on, and refuses to go on once the path
    no longer names the file it opened (:class:`~keeper_middleware.errors.sqlite.FileConnection`).
    ``check`` is how the file is checked when opened: SQLite's ``quick_check`` (every page's
    structure and records: a damaged file is refused here, not at some later cut), the full
    ``integrity_check`` (indexes against their tables too, slower), or not at all.
    """
    if path != ":memory:":
        _check_archive_path(Path(path))
    try:
        conn = sqlite3.connect(
            path,
            timeout=timeout,
            isolation_level=None,
            check_same_thread=False,
            factory=FileConnection,
        )
    except sqlite3.DatabaseError as exc:
        raise ArchiveError(_open_failure(path, exc)) from exc
    conn.name_file(path, "the archive")
    conn.row_factory = sqlite3.Row
    conn.create_function("keeper_digest", 7, _digest, deterministic=True)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={synchronous}")
        conn.execute("PRAGMA foreign_keys=ON")
        if check != "off":
            _check_pages(conn, path, check)
        _migrate(conn, path)
        _probe_write(conn)
        if path != ":memory:":
            conn.watch(path)
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise ArchiveError(_open_failure(path, exc)) from exc
    except ArchiveError as exc:
        conn.close()
        if isinstance(exc.__cause__, sqlite3.DatabaseError) and not isinstance(
            exc, ArchiveSchemaError
        ):
            raise ArchiveError(_open_failure(path, exc.__cause__)) from exc.__cause__
        raise
    except BaseException:
        conn.close()
        raise
    return conn


def _check_pages(conn: FileConnection, path: str, check: str) -> None:
    """Refuse a damaged file now (``PRAGMA quick_check`` / ``integrity_check``)."""
    pragma = "quick_check" if check == "quick" else "integrity_check"
    found = [str(row[0]) for row in conn.execute(f"PRAGMA {pragma}(5)").fetchall()]
    if found != ["ok"]:
        problems = "; ".join(" ".join(line.split()) for line in found)
        raise ArchiveError(
            f"the archive {path!r} is damaged: SQLite's {pragma} found {problems[:600]}. "
            "Restore it from a backup, or move it away and start a new file (the graph's "
            "checkpoints still hold what was in view)"
        )


def _migrate(conn: sqlite3.Connection, path: str) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
        found = row[0]
        if found is None:
            schema = _SCHEMA + sqlite_moved.CURRENT + ";" + sqlite_moved.SCHEMA
            _run(conn, schema + ";" + sqlite_handles.SCHEMA)
            conn.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION,))
        elif found in (1, 2, 3):
            if found == 1:  # moved entries were two JSON values: adopted per session on use
                _run(conn, sqlite_moved.CURRENT)
            if found < 3:
                _run(conn, _TO_V3)
                _chain_cuts(conn)
                _run(conn, sqlite_moved.SCHEMA + ";" + sqlite_moved.FROM_ROWS)
            _run(conn, sqlite_handles.SCHEMA)  # version 3 to 4
            conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))
        elif found > SCHEMA_VERSION:
            raise ArchiveSchemaError(
                f"the archive {path!r} has schema version {found}, but this "
                f"keeper-middleware reads up to {SCHEMA_VERSION}: upgrade keeper-middleware "
                "or open another file"
            )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _digest(
    item: int | None,
    role: str,
    content: str,
    tool_calls_json: str,
    tool_call_id: str | None,
    name: str | None,
    reasoning: str,
) -> str:
    return turn_digest(
        item=item,
        role=role,
        content=content,
        tool_calls_json=tool_calls_json,
        tool_call_id=tool_call_id,
        name=name,
        reasoning=reasoning,
    )


def _chain_cuts(conn: sqlite3.Connection) -> None:
    """Before version 3 a session was one line of cuts: each cut's parent is the one committed
    before it, its records start where the earlier cuts' end, and the NOTES in effect after it
    are the latest version written by then."""
    sessions = [row[0] for row in conn.execute("SELECT session FROM sessions")]
    for session in sessions:
        rows = conn.execute(
            "SELECT cut_key, turns_archived, notes_version FROM cuts WHERE session = ? "
            "ORDER BY rowid",
            (session,),
        ).fetchall()
        parent, first, notes_at, updates = None, 0, None, []
        for ordinal, (key, archived, version) in enumerate(rows, start=1):
            notes_at = version if version is not None else notes_at
            updates.append((parent, ordinal, first, notes_at, session, key))
            parent, first = key, first + int(archived)
        conn.executemany(
            "UPDATE cuts SET parent = ?, ordinal = ?, first_seq = ?, notes_at = ? "
            "WHERE session = ? AND cut_key = ?",
            updates,
        )
        conn.execute(
            "UPDATE sessions SET tip = ?, cuts = ? WHERE session = ?",
            (parent, len(rows), session),
        )


def _check_archive_path(path: Path) -> None:
    """Fails early, naming the path, where sqlite would say only "unable to open"."""
    if path.is_dir():
        raise ArchiveError(
            f"the archive {str(path)!r} is a directory; give a file path inside it, "
            f"e.g. {str(path / 'archive.sqlite3')!r}"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ArchiveError(
            f"cannot create the folder of the archive {str(path)!r}: {exc}; choose a writable path"
        ) from exc


def _run(conn: sqlite3.Connection, script: str) -> None:
    for statement in script.split(";"):
        if statement.strip():
            conn.execute(statement)


def _probe_write(conn: sqlite3.Connection) -> None:
    """A read-only file opens and reads; find out now, not at the first cut."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("UPDATE schema_version SET version = version")
    finally:
        conn.execute("ROLLBACK")


def _writable(path: Path) -> bool:
    """Whether the file and its folder (for the -wal and -shm files) can be written."""
    return os.access(path.parent, os.W_OK) and (not path.exists() or os.access(path, os.W_OK))


def _open_failure(path: str, exc: sqlite3.DatabaseError) -> str:
    text = str(exc)
    if "readonly" in text or "read-only" in text or not _writable(Path(path)):
        return (
            f"cannot open the archive {path!r}: it is read-only ({text}), and the keeper writes to it at every cut; "
            "make the file and its folder writable (SQLite adds -wal and -shm files beside it), "
            "or open a writable copy"
        )
    if "not a database" in text:
        return (
            f"cannot open the archive {path!r}: it is not a keeper archive ({text}); point "
            "archive= at a new file, or move this one away"
        )
    return f"cannot open the archive {path!r}: {describe(path, exc)}"
