"""The SQLite layouts released before branches, word for word as those releases created them
(schema version 1, and the table version 2 added), so the upgrade tests can write a file of any
earlier layout with the rows those releases wrote."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from keeper_middleware.archive.records import ArchivedTurn, NotesDraft

V1_SCHEMA = """
CREATE TABLE sessions (session TEXT PRIMARY KEY);
CREATE TABLE cuts (
    session TEXT NOT NULL REFERENCES sessions(session) ON DELETE CASCADE,
    cut_key TEXT NOT NULL,
    turns_archived INTEGER NOT NULL,
    notes_version INTEGER,
    created REAL NOT NULL,
    PRIMARY KEY (session, cut_key)
);
CREATE TABLE turns (
    session TEXT NOT NULL,
    seq INTEGER NOT NULL,
    msg_id TEXT NOT NULL,
    item INTEGER,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    tool_calls_json TEXT NOT NULL,
    tool_call_id TEXT,
    name TEXT,
    reasoning TEXT NOT NULL,
    cut_key TEXT NOT NULL,
    PRIMARY KEY (session, seq),
    UNIQUE (session, msg_id),
    FOREIGN KEY (session, cut_key) REFERENCES cuts(session, cut_key) ON DELETE CASCADE
);
CREATE INDEX turns_by_item ON turns(session, item, seq);
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

V2_MOVED = """
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


def write_v1(
    path: Path, session: str, cuts: list[tuple[str, list[ArchivedTurn], NotesDraft | None]]
) -> None:
    """A file of schema version 1 holding ``cuts`` (key, turns, notes) of one session, laid out
    as that release wrote them: seq gap-free in commit order, one NOTES version per cut with
    notes."""
    conn = sqlite3.connect(path)
    for statement in V1_SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    conn.execute("INSERT INTO schema_version VALUES (1)")
    conn.execute("INSERT INTO sessions VALUES (?)", (session,))
    seq, version = 0, 0
    for number, (key, turns, notes) in enumerate(cuts):
        notes_version = None
        if notes is not None:
            version += 1
            notes_version = version
        conn.execute(
            "INSERT INTO cuts VALUES (?, ?, ?, ?, ?)",
            (session, key, len(turns), notes_version, 1000.0 + number),
        )
        if notes is not None:
            conn.execute(
                "INSERT INTO notes VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    session,
                    version,
                    notes.first_item,
                    notes.last_item,
                    notes.text,
                    notes.data_json,
                    key,
                    1000.0 + number,
                ),
            )
        for turn in turns:
            conn.execute(
                "INSERT INTO turns (session, seq, msg_id, item, role, content, tool_calls_json, "
                "tool_call_id, name, reasoning, cut_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    session,
                    seq,
                    turn.msg_id,
                    turn.item,
                    turn.role,
                    turn.content,
                    turn.tool_calls_json,
                    turn.tool_call_id,
                    turn.name,
                    turn.reasoning,
                    key,
                ),
            )
            seq += 1
    conn.commit()
    conn.close()
