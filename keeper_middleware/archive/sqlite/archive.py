"""The SQLite archive backend: WAL mode, one transaction per cut.

The contract it meets is ``ArchiveStore`` (``keeper_middleware.archive.store``). A session that
never forked answers every question as one line of cuts, at no cost beyond that; once it has
forked, a branch's chain is read with one recursive query (docs/branches.md).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, ClassVar, Literal, Self

from keeper_middleware.archive.records import (
    TIP,
    ArchivedTurn,
    Chain,
    CutRecord,
    Head,
    MovedUpdate,
    NotesDraft,
    NotesVersion,
    _distinct_turns,
    _require_session,
)
from keeper_middleware.archive.rows import (
    CUT_COLUMNS,
    CUT_INSERT_COLUMNS,
    NOTES_COLUMNS,
    TURN_COLUMNS,
    cut_rows,
    place_turns,
    require_cut_key,
)
from keeper_middleware.archive.sqlite import branches as sqlite_branches
from keeper_middleware.archive.sqlite import handles as sqlite_handles
from keeper_middleware.archive.sqlite import moved as sqlite_moved
from keeper_middleware.archive.sqlite.moved_entries import SQLiteMovedEntries
from keeper_middleware.archive.sqlite.open import open_archive_file
from keeper_middleware.archive.sqlite.reads import SQLiteReads, cut_of
from keeper_middleware.archive.sqlite.values import UPSERT_VALUE, value_rows, write_values
from keeper_middleware.errors import (
    ArchiveError,
    ConfigurationError,
    unknown_cut,
)
from keeper_middleware.errors.sqlite import FileConnection

_ID_CHUNK = 500


class SQLiteArchive(SQLiteReads, SQLiteMovedEntries):
    """``ArchiveStore`` on one SQLite file in WAL mode (or ``":memory:"`` for tests).

    Durability: with ``synchronous="NORMAL"`` (the default) every commit is atomic and survives
    a crash or kill of the process; a power loss or OS crash can roll back the last few commits,
    never corrupt the file. If the graph's checkpoints live on a store that does survive power
    loss, a rolled-back cut would leave turns in neither place: use ``synchronous="FULL"`` (one
    fsync per commit; cuts are rare, so it is cheap) when that matters.

    Threads: one connection guarded by a lock, so one instance may be shared by a LangGraph
    thread pool and by asyncio code that calls it through ``asyncio.to_thread``. Iterators read
    in pages and hold the lock only per page, so a long read never blocks a cut. Several
    processes may open the same file; WAL plus a busy timeout of ``timeout`` seconds keeps them
    from corrupting it.
    """

    takes_json_text: ClassVar[bool] = True
    """A value given as :class:`~keeper_middleware.archive.json_text.JSONText` is written as
    it is (its text is what this store writes for the value)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        timeout: float = 30.0,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        check: Literal["quick", "full", "off"] = "quick",
    ) -> None:
        """Open (or create) the archive file and check it.

        Args:
            path: the SQLite file, or ``":memory:"``.
            timeout: seconds to wait for another process's write lock before failing.
            synchronous: ``"NORMAL"`` (atomic, survives a crash of the process) or ``"FULL"``
                (also survives a power loss: one fsync a commit).
            check: how the file is checked when it is opened (``open_archive_file``): SQLite's
                ``quick_check`` by default (0.5 s for a 230 MB file), ``"full"`` or ``"off"``.

        Raises:
            ConfigurationError: ``synchronous`` or ``check`` is not one of its values.
            ArchiveError: the file cannot be opened, is not an archive, or fails its check.
            ArchiveSchemaError: the file was written by a newer version.
        """
        if synchronous not in ("NORMAL", "FULL"):
            raise ConfigurationError(f'synchronous must be "NORMAL" or "FULL", got {synchronous!r}')
        if check not in ("quick", "full", "off"):
            raise ConfigurationError(f'check must be "quick", "full" or "off", got {check!r}')
        self.path = str(path)
        self._lock = threading.RLock()
        self._conn: FileConnection | None = open_archive_file(
            self.path, timeout=timeout, synchronous=synchronous, check=check
        )
        self._adopted: set[str] = set()
        """Sessions whose moved entries are known to be rows (old values adopted or none)."""
        self._present: set[str] = set()
        """Sessions whose row this archive wrote or found (a save of values then skips writing
        it again; one erased meanwhile by another process is written again on the refusal)."""
        self._latest: dict[str, NotesVersion | None] = {}
        """Each session's latest NOTES version as last read or written here (every keeper step
        reads it; only a cut changes it, and cuts of one session run in one process)."""
        self._notes_at: OrderedDict[tuple[str, Head], NotesVersion] = OrderedDict()
        """The NOTES in effect at a cut, as last read (they never change once committed)."""
        self._timeout = timeout
        self._read_lock = threading.Lock()
        self._reader: FileConnection | None = None
        self._no_reader = self.path == ":memory:"
        """Whether values are read on the main connection (an in-memory archive, or a file
        that is not in WAL mode, where a second connection would wait for writers anyway)."""

    def _live(self) -> FileConnection:
        if self._conn is None:
            raise ArchiveError(f"the archive {self.path!r} is closed; open a new SQLiteArchive")
        return self._conn

    def rescue(self, to: str | os.PathLike[str]) -> None:
        """Save a whole copy of what this connection holds to ``to`` (SQLite's backup).

        For the archive file deleted or replaced under a running keeper: the process still
        holds the file it opened, with every turn it acknowledged, and this writes it out.
        ``to`` must not exist yet.
        """
        target = os.fspath(to)
        if os.path.exists(target):
            raise ArchiveError(f"{target!r} exists; rescue the archive to a new path")
        with self._lock:
            conn = self._live()
            copy = sqlite3.connect(target)
            try:
                conn.backup(copy)
            except sqlite3.Error as exc:
                raise ArchiveError(f"cannot save the archive to {target!r}: {exc}") from exc
            finally:
                copy.close()

    def _before_commit(self, session: str, cut_key: str) -> None:
        """Runs inside the cut's transaction just before COMMIT (a seam for crash tests)."""

    def commit_cut(
        self,
        session: str,
        *,
        cut_key: str,
        turns: Sequence[ArchivedTurn],
        notes: NotesDraft | None,
        moved: MovedUpdate | None = None,
        parent: Head = TIP,
    ) -> CutRecord:
        _require_session(session)
        require_cut_key(cut_key)
        pending = _distinct_turns(session, turns)
        with self._lock:
            self._latest.pop(session, None)
            conn = self._live()
            conn.execute("BEGIN IMMEDIATE")
            try:
                existing = self._find_cut(conn, session, cut_key)
                if existing is not None:
                    conn.execute("ROLLBACK")
                    return existing
                conn.execute("INSERT OR IGNORE INTO sessions (session) VALUES (?)", (session,))
                tip, forked, count = sqlite_branches.tip_of(conn, session)
                base = tip if parent is TIP else parent
                notes_at = None
                if base is not None:
                    found = conn.execute(
                        "SELECT notes_at FROM cuts WHERE session = ? AND cut_key = ?",
                        (session, base),
                    ).fetchone()
                    if found is None:
                        raise unknown_cut(session, base)
                    notes_at = found[0]
                linear = not forked and base == tip
                chain = (
                    None if linear else sqlite_branches.chain_at(conn, session, base, tip, forked)
                )
                placed = place_turns(
                    pending,
                    sqlite_branches.stored(conn, session, pending),
                    (lambda seq: True) if chain is None else chain.sees,
                )
                ordinal = count + 1
                rows = cut_rows(
                    session,
                    cut_key,
                    placed.new,
                    notes,
                    notes_version=None if notes is None else self._next_version(conn, session),
                    first_seq=conn.execute(
                        "SELECT COALESCE(MAX(seq) + 1, 0) FROM turns WHERE session = ?", (session,)
                    ).fetchone()[0],
                    created=time.time(),
                    parent=base,
                    ordinal=ordinal,
                    notes_at=notes_at,
                )
                record = rows.record
                conn.execute(
                    f"INSERT INTO cuts ({CUT_INSERT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    rows.cut,
                )
                if rows.notes is not None:
                    conn.execute(
                        f"INSERT INTO notes ({NOTES_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        rows.notes,
                    )
                conn.executemany(
                    f"INSERT INTO turns ({TURN_COLUMNS}, cut_key) VALUES "
                    "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    rows.turns,
                )
                conn.executemany(
                    "INSERT INTO links (session, cut_key, seq, place) VALUES (?, ?, ?, ?)",
                    [(session, cut_key, seq, place) for seq, place in placed.links],
                )
                conn.execute(
                    "UPDATE sessions SET tip = ?, cuts = ?, forked = ? WHERE session = ?",
                    (cut_key, ordinal, int(forked or base != tip), session),
                )
                if moved:
                    sqlite_moved.adopt_legacy(conn, session, ordinal=count, linear=linear)
                    if chain is None:
                        sqlite_moved.apply_linear(conn, session, moved, ordinal=ordinal)
                    else:
                        holds = chain.holds_ordinal
                        sqlite_moved.apply(
                            conn,
                            session,
                            moved,
                            ordinal=ordinal,
                            holds=lambda o: o == ordinal or holds(o),
                        )
                self._before_commit(session, cut_key)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        return record

    def chain(self, session: str, head: Head = TIP) -> Chain:
        with self._lock:
            return sqlite_branches.chain(self._live(), session, head)

    @staticmethod
    def _next_version(conn: sqlite3.Connection, session: str) -> int:
        row = conn.execute(
            "SELECT COALESCE(MAX(version), 0) + 1 FROM notes WHERE session = ?", (session,)
        ).fetchone()
        return int(row[0])

    @staticmethod
    def _find_cut(conn: sqlite3.Connection, session: str, cut_key: str) -> CutRecord | None:
        row = conn.execute(
            f"SELECT {CUT_COLUMNS} FROM cuts WHERE session = ? AND cut_key = ?",
            (session, cut_key),
        ).fetchone()
        return None if row is None else cut_of(row)

    @staticmethod
    def _archived_ids(conn: sqlite3.Connection, session: str, msg_ids: list[str]) -> set[str]:
        found: set[str] = set()
        for start in range(0, len(msg_ids), _ID_CHUNK):
            chunk = msg_ids[start : start + _ID_CHUNK]
            marks = ", ".join("?" * len(chunk))
            rows = conn.execute(
                f"SELECT msg_id FROM turns WHERE session = ? AND msg_id IN ({marks})",
                (session, *chunk),
            )
            found.update(row[0] for row in rows)
        return found

    def find_cut(self, session: str, cut_key: str) -> CutRecord | None:
        with self._lock:
            return self._find_cut(self._live(), session, cut_key)

    def archived_ids(self, session: str, msg_ids: Iterable[str]) -> set[str]:
        """Read on the values' own connection (:meth:`get_value`): a request asks it as it
        takes in messages, and need not wait for other sessions' saves."""
        wanted = list(dict.fromkeys(msg_ids))
        with self._read_lock:
            reader = self._reading()
            if reader is not None:
                return self._archived_ids(reader, session, wanted)
        with self._lock:
            return self._archived_ids(self._live(), session, wanted)

    def set_positions(
        self,
        session: str,
        positions: Sequence[tuple[int, int]],
        values: Mapping[str, Any] | None = None,
    ) -> None:
        rows = value_rows(session, values or {})
        if not positions and not rows:
            return
        with self._lock:
            conn = self._live()
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany(
                    "UPDATE turns SET position = ? WHERE session = ? AND seq = ?",
                    [(position, session, seq) for seq, position in positions],
                )
                if rows:
                    conn.execute("INSERT OR IGNORE INTO sessions (session) VALUES (?)", (session,))
                    conn.executemany(UPSERT_VALUE, rows)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def positions(self, session: str, seqs: Collection[int]) -> dict[int, int | None]:
        with self._lock:
            return sqlite_branches.positions(self._live(), session, seqs)

    def get_value(self, session: str, key: str) -> Any | None:
        """A session's value, read on a connection of its own: in WAL mode a read never waits
        for a write, so a request reading its session's values (the search guard, the counters,
        a proxy's record) does not queue behind other sessions' saves committing on the main
        connection. Each read sees every commit made before it began."""
        sql = "SELECT value_json FROM kv WHERE session = ? AND key = ?"
        with self._read_lock:
            reader = self._reading()
            if reader is not None:
                row = reader.execute(sql, (session, key)).fetchone()
                return json.loads(row[0]) if row is not None else None
        rows = self._query(sql, (session, key))
        return json.loads(rows[0][0]) if rows else None

    def _reading(self) -> FileConnection | None:
        """The connection values are read on (read lock held); None: read on the main one."""
        if self._reader is not None or self._no_reader:
            return self._reader
        self._live()
        reader = sqlite3.connect(
            self.path,
            timeout=self._timeout,
            isolation_level=None,
            check_same_thread=False,
            factory=FileConnection,
        )
        try:
            reader.name_file(self.path, "the archive")
            mode = reader.execute("PRAGMA journal_mode").fetchone()[0]
            if str(mode).lower() != "wal":
                reader.close()
                self._no_reader = True
                return None
            reader.execute("PRAGMA query_only=ON")
            reader.watch(self.path)
        except BaseException:
            reader.close()
            raise
        self._reader = reader
        return reader

    def put_value(self, session: str, key: str, value: Any) -> None:
        self.put_values(session, {key: value})

    def put_values(self, session: str, values: Mapping[str, Any]) -> None:
        """Upsert several values in one transaction (in the mapping's order): all or none.

        One commit instead of one per value is most of what saving a session costs, and a
        batch that only upserts is one statement (``sqlite.values``). A value of None deletes
        its key (reading it gives None either way), so a store that retires keys, as the
        proxy's session record retires its old chunks, leaves no rows behind."""
        _require_session(session)
        gone = [(session, key) for key, value in values.items() if value is None]
        rows = value_rows(session, {k: v for k, v in values.items() if v is not None})
        if not rows and not gone:
            return
        with self._lock:
            write_values(self._live(), session, rows, gone, present=session in self._present)
            self._present.add(session)

    def put_handle(self, session: str, handle: str, value: Any) -> None:
        """Record a handle for ``session`` (``archive.handles.HandleStore``)."""
        _require_session(session)
        ((_, _, value_json),) = value_rows(session, {handle: value})
        with self._lock:
            conn = self._live()
            conn.execute("BEGIN IMMEDIATE")
            try:
                sqlite_handles.put(conn, session, handle, value_json)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def find_handle(self, handle: str) -> tuple[str, Any] | None:
        with self._lock:
            return sqlite_handles.find(self._live(), handle)

    def sessions(self) -> list[str]:
        return [row[0] for row in self._query("SELECT session FROM sessions ORDER BY session", ())]

    def delete_session(self, session: str) -> None:
        """Remove the session's turns, notes, cuts and values (the one way anything is erased)."""
        with self._lock:
            self._latest.pop(session, None)
            for key in [k for k in self._notes_at if k[0] == session]:
                del self._notes_at[key]
            self._live().execute("DELETE FROM sessions WHERE session = ?", (session,))
            self._adopted.discard(session)
            self._present.discard(session)

    def close(self) -> None:
        with self._lock, self._read_lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None
            self._no_reader = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SQLiteArchive({self.path!r})"
