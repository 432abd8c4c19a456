"""The PostgreSQL archive backend: many processes, one database.

The contract it meets is ``ArchiveStore`` (``keeper_middleware.archive.store``).

A cut is one transaction, as in SQLite: the session's row is locked (``FOR UPDATE``) first, so
two processes committing cuts of one session take turns, ``seq`` stays gap-free and notes
versions count up by one; the cut record, the notes version and the turns commit together or
not at all. A process killed at any point leaves either the whole cut or none of it (the server
rolls back a transaction whose connection is gone), and committing the same ``cut_key`` again
returns the first record.

Beyond the contract it implements ``HandleStore`` (``archive.handles``) and
``SessionLockBackend`` with the server's advisory locks
(``locks``). Branches (docs/branches.md) are kept as in SQLite: a session that never forked is
one line of cuts at no extra cost; a forked one reads a branch's chain with one recursive query.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, ClassVar, Self

from keeper_middleware.archive.json_text import value_text
from keeper_middleware.archive.postgres import branches as pg_branches
from keeper_middleware.archive.postgres import handles as pg_handles
from keeper_middleware.archive.postgres import moved as pg_moved
from keeper_middleware.archive.postgres.connect import (
    check_schema_name,
    connect,
    is_postgres_url,
    redact_url,
    require_psycopg,
    split_schema,
    translated_errors,
)
from keeper_middleware.archive.postgres.locks import AdvisoryLocks
from keeper_middleware.archive.postgres.moved_entries import PostgresMovedEntries
from keeper_middleware.archive.postgres.reads import PostgresReads
from keeper_middleware.archive.postgres.rows import (
    cut_from_row,
    encoded,
    refuse_nul,
)
from keeper_middleware.archive.postgres.schema import setup
from keeper_middleware.archive.records import (
    TIP,
    ArchivedTurn,
    Chain,
    CutRecord,
    Head,
    MovedUpdate,
    NotesDraft,
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
from keeper_middleware.errors import (
    ArchiveError,
    ArgumentTypeError,
    ConfigurationError,
    unknown_cut,
)


class PostgresArchive(PostgresReads, PostgresMovedEntries):
    """``ArchiveStore`` on PostgreSQL, shared by every worker and replica that opens the URL.

    ``schema`` (default ``keeper``; also ``?schema=name`` in the URL) holds the tables (created on
    first use, migrated forward on open), so one database can hold several archives (tenants)
    and LangGraph's checkpoint tables beside them. Each call
    takes a connection from a ``psycopg_pool.ConnectionPool`` of ``min_size``..``max_size``
    connections; ``timeout`` bounds connecting and waiting for a free connection. Errors are
    ``ArchiveError``s naming the server without its password.
    """

    takes_json_text: ClassVar[bool] = True
    """A value given as :class:`~keeper_middleware.archive.json_text.JSONText` is written as
    it is (its text is what this store writes for the value)."""

    def __init__(
        self,
        url: str,
        *,
        schema: str | None = None,
        min_size: int = 1,
        max_size: int = 10,
        timeout: float = 30.0,
    ) -> None:
        if not is_postgres_url(url):
            raise ConfigurationError(
                f"url must start with postgresql:// (or postgres://), got {redact_url(url)!r}: "
                "e.g. postgresql://user:password@host:5432/dbname"
            )
        if min_size < 1 or max_size < min_size:
            raise ConfigurationError(
                f"pool sizes must satisfy 1 <= min_size <= max_size, got {min_size}, {max_size}"
            )
        require_psycopg()
        from psycopg_pool import ConnectionPool

        url, in_url = split_schema(url)
        if schema is not None and in_url is not None and schema != in_url:
            raise ConfigurationError(
                f"the URL says schema={in_url!r} but schema={schema!r} was passed"
            )
        self.url = url
        self.schema = check_schema_name(schema or in_url or "keeper")
        self.timeout = timeout
        with connect(url, timeout=timeout) as first, self._errors("creating the tables"):
            self.migration = setup(first, self.schema, url)
        self._pool: ConnectionPool[Any] | None = ConnectionPool(
            url,
            min_size=min_size,
            max_size=max_size,
            timeout=timeout,
            kwargs={"autocommit": True},
            open=False,
            name=f"keeper-archive-{self.schema}",
        )
        with self._errors("opening the connection pool"):
            self._pool.open(wait=True, timeout=timeout)
        self._locks = AdvisoryLocks(url, self.schema, timeout=timeout)
        self._adopted: set[str] = set()
        """Sessions whose moved entries are known to be rows (old values adopted or none)."""

    # ------------------------------------------------------------------ plumbing

    def _errors(self, doing: str) -> Any:
        return translated_errors(self.url, doing)

    def _live_pool(self) -> Any:
        if self._pool is None:
            raise ArchiveError(
                f"the archive at {redact_url(self.url)} is closed; open a new PostgresArchive"
            )
        return self._pool

    def _before_commit(self, session: str, cut_key: str) -> None:
        """Runs inside the cut's transaction just before COMMIT (a seam for crash tests)."""

    # ------------------------------------------------------------------ writing

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
        return self.import_cut(
            session, cut_key=cut_key, turns=turns, notes=notes, moved=moved, parent=parent
        )

    def import_cut(
        self,
        session: str,
        *,
        cut_key: str,
        turns: Sequence[ArchivedTurn],
        notes: NotesDraft | None,
        created: float | None = None,
        moved: MovedUpdate | None = None,
        parent: Head = TIP,
    ) -> CutRecord:
        """``commit_cut`` keeping the time the cut was first made (for migrations)."""
        _require_session(session)
        refuse_nul(session, "session")
        require_cut_key(cut_key)
        refuse_nul(cut_key, "cut_key")
        pending = _distinct_turns(session, turns)
        for turn in pending:
            refuse_nul(turn.msg_id, "msg_id")
            refuse_nul(turn.name, "name")
            refuse_nul(turn.tool_call_id, "tool_call_id")
        s = self.schema
        with (
            self._errors("committing a cut"),
            self._live_pool().connection() as conn,
            conn.transaction(),
        ):
            conn.execute(
                f"INSERT INTO {s}.sessions (session) VALUES (%s) ON CONFLICT DO NOTHING",
                (session,),
            )
            next_seq, next_version, tip, forked, count = conn.execute(
                f"SELECT next_seq, next_version, tip, forked, cuts FROM {s}.sessions "
                "WHERE session = %s FOR UPDATE",
                (session,),
            ).fetchone()
            forked = bool(forked)
            row = conn.execute(
                f"SELECT {CUT_COLUMNS} FROM {s}.cuts WHERE session = %s AND cut_key = %s",
                (session, cut_key),
            ).fetchone()
            if row is not None:
                return cut_from_row(row)
            base = tip if parent is TIP else parent
            notes_at = None
            if base is not None:
                found = conn.execute(
                    f"SELECT notes_at FROM {s}.cuts WHERE session = %s AND cut_key = %s",
                    (session, base),
                ).fetchone()
                if found is None:
                    raise unknown_cut(session, base)
                notes_at = found[0]
            linear = not forked and base == tip
            chain = None if linear else pg_branches.chain_at(conn, s, session, base, tip, forked)
            placed = place_turns(
                pending,
                pg_branches.stored(conn, s, session, pending),
                (lambda seq: True) if chain is None else chain.sees,
            )
            new = placed.new
            ordinal = count + 1
            rows = cut_rows(
                session,
                cut_key,
                new,
                notes,
                notes_version=None if notes is None else next_version,
                first_seq=next_seq,
                created=time.time() if created is None else created,
                parent=base,
                ordinal=ordinal,
                notes_at=notes_at,
                text=encoded,
            )
            record = rows.record
            conn.execute(
                f"INSERT INTO {s}.cuts ({CUT_INSERT_COLUMNS}) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                rows.cut,
            )
            if rows.notes is not None:
                conn.execute(
                    f"INSERT INTO {s}.notes ({NOTES_COLUMNS}) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                    rows.notes,
                )
            with conn.cursor() as cursor:
                if new:
                    cursor.executemany(
                        f"INSERT INTO {s}.turns ({TURN_COLUMNS}, cut_key) "
                        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                        rows.turns,
                    )
                if placed.links:
                    cursor.executemany(
                        f"INSERT INTO {s}.links (session, cut_key, seq, place) "
                        "VALUES (%s, %s, %s, %s)",
                        [(session, cut_key, seq, place) for seq, place in placed.links],
                    )
            conn.execute(
                f"UPDATE {s}.sessions SET next_seq = %s, next_version = %s, tip = %s, "
                "cuts = %s, forked = %s WHERE session = %s",
                (
                    next_seq + len(new),
                    next_version + (notes is not None),
                    cut_key,
                    ordinal,
                    forked or base != tip,
                    session,
                ),
            )
            if moved:
                pg_moved.adopt_legacy(conn, s, session, ordinal=count, linear=linear)
                if chain is None:
                    pg_moved.apply_linear(conn, s, session, moved, ordinal=ordinal)
                else:
                    holds = chain.holds_ordinal
                    pg_moved.apply(
                        conn,
                        s,
                        session,
                        moved,
                        ordinal=ordinal,
                        holds=lambda o: o == ordinal or holds(o),
                    )
            self._before_commit(session, cut_key)
        return record

    def chain(self, session: str, head: Head = TIP) -> Chain:
        with self._errors("reading"), self._live_pool().connection() as conn:
            return pg_branches.chain(conn, self.schema, session, head)

    def _archived_ids(self, conn: Any, session: str, msg_ids: list[str]) -> set[str]:
        if not msg_ids:
            return set()
        rows = conn.execute(
            f"SELECT msg_id FROM {self.schema}.turns WHERE session = %s AND msg_id = ANY(%s)",
            (session, msg_ids),
        )
        return {row[0] for row in rows}

    def put_value(self, session: str, key: str, value: Any) -> None:
        self.put_values(session, {key: value})

    def put_values(self, session: str, values: Mapping[str, Any]) -> None:
        """Upsert several values in one transaction (in the mapping's order): all or none. A
        value of None deletes its key, as in the SQLite archive."""
        _require_session(session)
        refuse_nul(session, "session")
        rows = []
        gone = []
        for key, value in values.items():
            refuse_nul(key, "key")
            if value is None:
                gone.append((session, key))
                continue
            try:
                value_json = value_text(value)
            except (TypeError, ValueError) as exc:
                raise ArgumentTypeError(
                    f"value for {key!r} must be JSON-able (dict, list, str, number, bool, None): "
                    f"{exc}"
                ) from exc
            rows.append((session, key, value_json))
        if not rows and not gone:
            return
        s = self.schema
        with (
            self._errors("saving values"),
            self._live_pool().connection() as conn,
            conn.transaction(),
        ):
            conn.execute(
                f"INSERT INTO {s}.sessions (session) VALUES (%s) ON CONFLICT DO NOTHING",
                (session,),
            )
            with conn.cursor() as cursor:
                if rows:
                    cursor.executemany(
                        f"INSERT INTO {s}.kv (session, key, value_json) VALUES (%s, %s, %s) "
                        "ON CONFLICT (session, key) DO UPDATE SET value_json = excluded.value_json",
                        rows,
                    )
                if gone:
                    cursor.executemany(f"DELETE FROM {s}.kv WHERE session = %s AND key = %s", gone)

    def put_handle(self, session: str, handle: str, value: Any) -> None:
        """Record a handle for ``session`` (``archive.handles.HandleStore``)."""
        _require_session(session)
        for text in (session, handle):
            refuse_nul(text, "handle")
        try:
            value_json = json.dumps(value, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ArgumentTypeError(f"a handle's value must be JSON-able: {exc}") from exc
        with (
            self._errors("saving a handle"),
            self._live_pool().connection() as conn,
            conn.transaction(),
        ):
            pg_handles.put(conn, self.schema, session, handle, value_json)

    def find_handle(self, handle: str) -> tuple[str, Any] | None:
        if "\x00" in handle:
            return None
        with self._errors("reading"), self._live_pool().connection() as conn:
            return pg_handles.find(conn, self.schema, handle)

    def delete_session(self, session: str) -> None:
        """Remove the session's turns, notes, cuts and values (the one way anything is erased)."""
        with self._errors("deleting a session"), self._live_pool().connection() as conn:
            conn.execute(f"DELETE FROM {self.schema}.sessions WHERE session = %s", (session,))
        self._adopted.discard(session)

    # ------------------------------------------------------------------ reading

    def archived_ids(self, session: str, msg_ids: Iterable[str]) -> set[str]:
        wanted = list(dict.fromkeys(msg_ids))
        with self._errors("reading"), self._live_pool().connection() as conn:
            return self._archived_ids(conn, session, wanted)

    def set_positions(
        self,
        session: str,
        positions: Sequence[tuple[int, int]],
        values: Mapping[str, Any] | None = None,
    ) -> None:
        if positions:
            with (
                self._errors("saving positions"),
                self._live_pool().connection() as conn,
                conn.transaction(),
            ):
                pg_branches.set_positions(conn, self.schema, session, positions)
        if values:  # after the positions: an index caught up is never ahead of them
            self.put_values(session, values)

    def get_value(self, session: str, key: str) -> Any | None:
        rows = self._query(
            f"SELECT value_json FROM {self.schema}.kv WHERE session = %s AND key = %s",
            (session, key),
        )
        return json.loads(rows[0][0]) if rows else None

    def sessions(self) -> list[str]:
        rows = self._query(f"SELECT session FROM {self.schema}.sessions ORDER BY session", ())
        return [row[0] for row in rows]

    def size_bytes(self) -> int:
        """Bytes the archive's tables and indexes take on the server."""
        rows = self._query(
            "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind IN ('r', 'm')",
            (self.schema,),
        )
        return int(rows[0][0])

    # ------------------------------------------------------------------ session locks

    def try_lock_session(self, session: str) -> bool:
        self._live_pool()
        return self._locks.try_lock(session)

    def unlock_session(self, session: str) -> None:
        self._locks.unlock(session)

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        self._locks.close()
        if self._pool is not None:
            self._pool.close()
            self._pool = None

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
        return f"PostgresArchive({redact_url(self.url)!r}, schema={self.schema!r})"
