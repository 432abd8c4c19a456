"""Moving a SQLite archive (a file, or the proxy's data folder) into PostgreSQL.

Cuts are replayed in the order they were made, each with its own turns and NOTES version and its
original time, after the same parent, through the same one-transaction commit as a live cut:
``seq``, notes versions and the tree of branches come out as they were (a record a cut took up
from another branch is linked again, not copied), and a migration stopped at any point is
finished by running it again (a cut already copied is recognised by its key and skipped). Per-session values (counters, search
guards, the proxy's session records), handles (the proxy's response ids) and the entries moved
out of the NOTES are copied after the cuts, and the keyword index is rebuilt
in the database from the archived turns, so the new deployment needs none of the old files. The
source is only read.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from keeper_middleware.archive.moved_rows import LoggedRow
from keeper_middleware.archive.postgres.archive import PostgresArchive
from keeper_middleware.archive.records import ArchivedTurn, MovedUpdate, NotesDraft
from keeper_middleware.archive.schema_version import SCHEMA_VERSION
from keeper_middleware.errors import ArchiveError
from keeper_middleware.retrievers.postgres_keyword import PostgresKeywordRetriever
from keeper_middleware.search.indexing import INDEXED_SEQ, NEXT_POSITION, catch_up

PROXY_ARCHIVE_FILE = "keeper.sqlite3"
"""The archive's file name in a ``keeper-proxy --archive-dir`` folder."""


@dataclass(frozen=True, slots=True)
class SessionCopy:
    """What one session's migration found and wrote."""

    session: str
    cuts: int
    """Cuts in the source."""
    cuts_copied: int
    """Cuts written now (the rest were there from an earlier run)."""
    turns: int
    """Turns in the target after the copy (equals the source's)."""
    notes_versions: int
    values: int
    passages: int
    """Passages in the target's keyword index."""


def source_file(source: str | Path) -> Path:
    """The SQLite file of ``source``: the file itself, or the archive in a proxy data folder."""
    path = Path(source)
    if path.is_dir():
        path = path / PROXY_ARCHIVE_FILE
        if not path.is_file():
            found = sorted(p.name for p in Path(source).iterdir())[:10]
            raise ArchiveError(
                f"{source} is a folder without {PROXY_ARCHIVE_FILE} (it holds {found}); pass the "
                "archive file itself, or the folder given to keeper-proxy --archive-dir"
            )
    elif not path.is_file():
        raise ArchiveError(f"no SQLite archive at {source}: pass an archive file or folder")
    return path


def _branched(raw: sqlite3.Connection) -> bool:
    """Whether the file keeps branches (schema version 3: parents, links, a log of moves)."""
    return raw.execute("SELECT 1 FROM sqlite_master WHERE name = 'links'").fetchone() is not None


def _cuts(raw: sqlite3.Connection, session: str) -> Iterator[tuple[str, float, str | None, int]]:
    """(cut_key, created, parent, ordinal) in the order the cuts were committed; a file made
    before branches holds one line of cuts, each after the one before it."""
    if _branched(raw):
        yield from raw.execute(
            "SELECT cut_key, created, parent, ordinal FROM cuts WHERE session = ? ORDER BY ordinal",
            (session,),
        )
        return
    parent = None
    rows = raw.execute(
        "SELECT cut_key, created FROM cuts WHERE session = ? ORDER BY rowid", (session,)
    )
    for ordinal, (key, created) in enumerate(rows, start=1):
        yield key, created, parent, ordinal
        parent = key


_TURN = (
    "SELECT session, msg_id, item, role, content, tool_calls_json, tool_call_id, name, "
    "reasoning FROM turns"
)


def _turn(row: tuple[object, ...]) -> ArchivedTurn:
    return ArchivedTurn(
        session=str(row[0]),
        msg_id=str(row[1]),
        item=row[2],  # type: ignore[arg-type]
        role=str(row[3]),
        content=str(row[4]),
        tool_calls_json=str(row[5]),
        tool_call_id=row[6],  # type: ignore[arg-type]
        name=row[7],  # type: ignore[arg-type]
        reasoning=str(row[8]),
    )


def _turns_of(raw: sqlite3.Connection, session: str, key: str) -> list[ArchivedTurn]:
    """The records a cut brought onto its branch, in its order: its own and, in a file that
    keeps branches, those it linked from another branch."""
    owned = [
        _turn(row)
        for row in raw.execute(
            f"{_TURN} WHERE session = ? AND cut_key = ? ORDER BY seq", (session, key)
        )
    ]
    if not _branched(raw):
        return owned
    linked = raw.execute(
        "SELECT l.place, t.session, t.msg_id, t.item, t.role, t.content, t.tool_calls_json, "
        "t.tool_call_id, t.name, t.reasoning FROM links AS l JOIN turns AS t "
        "ON t.session = l.session AND t.seq = l.seq WHERE l.session = ? AND l.cut_key = ? "
        "ORDER BY l.place",
        (session, key),
    ).fetchall()
    turns = list(owned)
    for row in linked:
        turns.insert(int(row[0]), _turn(row[1:]))
    return turns


def _moves_of(raw: sqlite3.Connection, session: str, ordinal: int) -> MovedUpdate | None:
    """What a cut changed in the moved entries, in a file that keeps them as a log."""
    if not _branched(raw):
        return None
    rows = [
        LoggedRow(
            id=row[0], ordinal=ordinal, key=row[1], value=row[2], gone=bool(row[3]), place=row[4]
        )
        for row in raw.execute(
            "SELECT id, key, value, gone, place FROM moved_log WHERE session = ? AND ordinal = ? "
            "ORDER BY id",
            (session, ordinal),
        )
    ]
    if not rows:
        return None

    def kept_its_place(row: LoggedRow) -> bool:
        """A key unset after a recall keeps its place; one moved out anew takes a new one."""
        earlier = raw.execute(
            "SELECT 1 FROM moved_log WHERE session = ? AND key = ? AND place = ? AND id < ?",
            (session, row.key, row.place, row.id),
        ).fetchone()
        return earlier is not None

    forgotten = {r.id for r in rows if not r.gone and r.value is None and kept_its_place(r)}
    return MovedUpdate(
        drop=tuple(r.key for r in rows if r.gone),
        forget=tuple(r.key for r in rows if r.id in forgotten),
        add=tuple((r.key, r.value) for r in rows if not r.gone and r.id not in forgotten),
    )


def _notes_of(raw: sqlite3.Connection, session: str, key: str) -> NotesDraft | None:
    row = raw.execute(
        "SELECT first_item, last_item, text, data_json FROM notes WHERE session = ? AND "
        "cut_key = ?",
        (session, key),
    ).fetchone()
    if row is None:
        return None
    return NotesDraft(first_item=row[0], last_item=row[1], text=row[2], data_json=row[3])


def _copy_handles(raw: sqlite3.Connection, target: PostgresArchive, session: str) -> None:
    """The session's handles (the proxy's response ids), those not copied yet: a file before
    layout 4 has none."""
    if raw.execute("SELECT 1 FROM sqlite_master WHERE name = 'handles'").fetchone() is None:
        return
    rows = raw.execute("SELECT handle, value_json FROM handles WHERE session = ?", (session,))
    for handle, value_json in rows.fetchall():
        if target.find_handle(handle) is None:
            target.put_handle(session, handle, json.loads(value_json))


def _moved_of(raw: sqlite3.Connection, session: str) -> tuple[tuple[str, str | None], ...]:
    """The session's moved entries in order (none in a file of the first layout: those are
    values, copied as such and moved to rows by the target on first use)."""
    if raw.execute("SELECT 1 FROM sqlite_master WHERE name = 'moved'").fetchone() is None:
        return ()
    rows = raw.execute("SELECT key, value FROM moved WHERE session = ? ORDER BY seq", (session,))
    return tuple((key, value) for key, value in rows)


def _one(raw: sqlite3.Connection, sql: str, *params: object) -> int:
    return int(raw.execute(sql, params).fetchone()[0])


def migrate_session(
    raw: sqlite3.Connection,
    target: PostgresArchive,
    index: PostgresKeywordRetriever,
    session: str,
) -> SessionCopy:
    """Copy one session: its cuts in order, then its values, then rebuild its keyword index."""
    cuts = copied = 0
    for key, created, parent, ordinal in _cuts(raw, session):
        cuts += 1
        if target.find_cut(session, key) is not None:
            continue
        target.import_cut(
            session,
            cut_key=key,
            turns=_turns_of(raw, session, key),
            notes=_notes_of(raw, session, key),
            created=created,
            moved=_moves_of(raw, session, ordinal),
            parent=parent,
        )
        copied += 1
    count = _one(raw, "SELECT COUNT(*) FROM turns WHERE session = ?", session)
    if target.turn_count(session) != count:
        raise ArchiveError(
            f"session {session!r}: {count} turns in the source but "
            f"{target.turn_count(session)} in the target after the copy; the target already "
            "held other turns of this session: migrate into an empty schema"
        )
    values = 0
    rows = raw.execute("SELECT key, value_json FROM kv WHERE session = ? ORDER BY key", (session,))
    for key, value_json in rows.fetchall():
        if key not in (INDEXED_SEQ, NEXT_POSITION):  # the index is rebuilt below
            target.put_value(session, key, json.loads(value_json))
            values += 1
    _copy_handles(raw, target, session)
    moved = _moved_of(raw, session)
    if moved and not _branched(raw):
        target.update_moved(session, MovedUpdate(add=moved))
    index.delete_session(session)
    target.put_value(session, INDEXED_SEQ, -1)
    target.put_value(session, NEXT_POSITION, 0)
    passages = catch_up(target, session, (index,))
    return SessionCopy(
        session=session,
        cuts=cuts,
        cuts_copied=copied,
        turns=target.turn_count(session),
        notes_versions=sum(1 for _ in target.notes_versions(session)),
        values=values,
        passages=passages,
    )


def migrate(
    source: str | Path,
    url: str,
    *,
    schema: str | None = None,
    sessions: list[str] | None = None,
    report: Callable[[SessionCopy], None] = lambda copy: None,
) -> list[SessionCopy]:
    """Copy every session (or the given ones) of a SQLite archive into PostgreSQL."""
    path = source_file(source)
    raw = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    copies = []
    try:
        try:
            version = _one(raw, "SELECT MAX(version) FROM schema_version")
            present = [row[0] for row in raw.execute("SELECT session FROM sessions ORDER BY 1")]
        except (sqlite3.DatabaseError, TypeError) as exc:
            raise ArchiveError(f"{path} is not a keeper archive: {exc}") from exc
        if version > SCHEMA_VERSION:
            raise ArchiveError(
                f"{path} has schema version {version}; this keeper-middleware reads up to "
                f"{SCHEMA_VERSION}: upgrade keeper-middleware before migrating"
            )
        chosen = present if sessions is None else sessions
        missing = sorted(set(chosen) - set(present))
        if missing:
            raise ArchiveError(f"no session {missing[0]!r} in {path}; it has {present[:10]}")
        with PostgresArchive(url, schema=schema) as target:
            index = PostgresKeywordRetriever(target.url, schema=target.schema)
            try:
                for session in chosen:
                    copy = migrate_session(raw, target, index, session)
                    copies.append(copy)
                    report(copy)
            finally:
                index.close()
    finally:
        raw.close()
    return copies
