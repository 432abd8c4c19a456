"""The archive's storage contract: ``ArchiveStore``, and how a path or URL becomes a store.

A cut is one transaction: the turns it moves out, the NOTES version written for them and the
record of the cut itself are committed together or not at all, so after a crash at any point the
archive holds every turn exactly once and the notes match it. A cut is keyed by ``cut_key``;
committing the same key again returns the first record and changes nothing, which is how a keeper
that crashed after the commit but before its graph state was saved recovers without writing a
second notes version.

Branches: every cut names its parent (the branch's cut before it), so the cuts of one session
form a tree as LangGraph's checkpoints do, and whatever reads memory names the branch by its
latest cut (its *head*): the NOTES in effect there, the records it sees, the entries moved out
of its NOTES. Records are shared, never copied: a turn another branch archived first is linked
to the cut that needs it. A session that never forked answers everything as before
(docs/branches.md).

Storage sits behind ``ArchiveStore``: ``SQLiteArchive`` (one file, the embedded default) and
``PostgresArchive`` (one database shared by workers and replicas, ``keeper_middleware.archive.postgres``).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol, Self, runtime_checkable

from keeper_middleware.archive.json_text import plain, takes_json_text
from keeper_middleware.archive.records import (
    TIP,
    ArchivedTurn,
    Chain,
    CutRecord,
    Head,
    MovedUpdate,
    NotesDraft,
    NotesVersion,
)
from keeper_middleware.archive.schema_version import SCHEMA_VERSION
from keeper_middleware.errors import ArchiveSchemaError, ArgumentTypeError, UnknownCutError

__all__ = [
    "SCHEMA_VERSION",
    "ArchiveSchemaError",
    "ArchiveStore",
    "UnknownCutError",
    "open_archive",
    "put_values",
]


@runtime_checkable
class ArchiveStore(Protocol):
    """Where archived turns, NOTES versions and small per-session state live.

    Every method is synchronous; async callers run them in a thread (``asyncio.to_thread``).
    Iterators stream: they never load a whole session at once.
    """

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
        """In one transaction: the records of the turns the branch does not hold yet (by
        message id and digest; one another branch archived first is linked, not copied), the
        notes version (if any), the change to the moved entries (if any) and the cut record,
        with ``parent`` as the cut before it (:data:`TIP`: the session's latest cut). A cut_key
        already committed returns its first record and changes nothing."""
        ...

    def update_moved(self, session: str, update: MovedUpdate) -> None:
        """Apply ``update`` to the moved entries outside a cut (copying an archive), in one
        transaction, as of the session's latest cut."""
        ...

    def moved_named(
        self, session: str, words: Collection[str], *, within: Chain | None = None
    ) -> list[tuple[str, str]]:
        """The moved entries that have a value and whose key's first case-folded word is one of
        ``words`` (``moved_rows.key_lookup``), in the order they moved: the candidates a text
        with those words may name. Reads only the rows it returns. ``within``: as that branch
        has them (None: as of the session's latest cut)."""
        ...

    def moved_among(
        self, session: str, folded: Collection[str], *, within: Chain | None = None
    ) -> list[str]:
        """The moved keys whose case-folded form is one of ``folded`` (with a value or not)."""
        ...

    def moved_rows(
        self, session: str, *, within: Chain | None = None
    ) -> Iterator[tuple[str, str | None]]:
        """Every moved key with its value (None: none to recall), in the order they moved.

        Sessions stored with the old layout (two JSON values) are moved to rows on first use of
        any of these methods, in one transaction."""
        ...

    def find_cut(self, session: str, cut_key: str) -> CutRecord | None: ...

    def cuts(self, session: str, *, after: int = 0) -> Iterator[CutRecord]:
        """Every cut of the session in the order it was committed (all branches), from the
        one after ordinal ``after``."""
        ...

    def chain(self, session: str, head: Head = TIP) -> Chain:
        """What the branch whose latest cut is ``head`` sees (raises ``ArchiveError`` for a cut
        the session does not have)."""
        ...

    def turns(
        self,
        session: str,
        *,
        from_item: int | None = None,
        to_item: int | None = None,
        after_seq: int = -1,
        within: Chain | None = None,
    ) -> Iterator[ArchivedTurn]:
        """Turns in seq order; item bounds are inclusive and leave out turns with no item.
        ``within``: only the records that branch sees (None: every record of the session)."""
        ...

    def turn(
        self, session: str, msg_id: str, *, within: Chain | None = None
    ) -> ArchivedTurn | None:
        """The latest archived record of a message id (how an excerpt's pointer is followed);
        ``within``: the latest that branch sees."""
        ...

    def turn_count(self, session: str) -> int:
        """The records of the session, every branch's."""
        ...

    def archived_ids(self, session: str, msg_ids: Iterable[str]) -> set[str]:
        """Which of these message ids have a record (on any branch)."""
        ...

    def set_positions(
        self,
        session: str,
        positions: Sequence[tuple[int, int]],
        values: Mapping[str, Any] | None = None,
    ) -> None:
        """Record (seq, the position of the record's first search passage) pairs: how a branch's
        records are found among the search index's passages (``indexing.catch_up``); with
        ``values``, upsert those per-session values in the same transaction."""
        ...

    def positions(self, session: str, seqs: Collection[int]) -> dict[int, int | None]:
        """The recorded first passage position of each of these records (None: not recorded)."""
        ...

    def latest_notes(self, session: str) -> NotesVersion | None:
        """The NOTES in effect at the session's latest cut."""
        ...

    def notes_at(self, session: str, head: Head = TIP) -> NotesVersion | None:
        """The NOTES in effect at the cut ``head`` (None: no NOTES yet on that branch)."""
        ...

    def notes_versions(self, session: str) -> Iterator[NotesVersion]:
        """Every saved version, every branch's, in the order they were written."""
        ...

    def get_value(self, session: str, key: str) -> Any | None: ...

    def put_value(self, session: str, key: str, value: Any) -> None:
        """Upsert small JSON-able per-session state (search guards, counters)."""
        ...

    def sessions(self) -> list[str]: ...

    def delete_session(self, session: str) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


def put_values(store: ArchiveStore, session: str, values: Mapping[str, Any]) -> None:
    """Write ``values`` (in order) in one transaction where the store can (a ``put_values``
    method, as :class:`~keeper_middleware.archive.sqlite.SQLiteArchive` has), else one
    ``put_value`` each: a store without batches stays correct, only slower."""
    if not takes_json_text(store):
        values = plain(values)
    batch = getattr(store, "put_values", None)
    if batch is not None:
        batch(session, values)
        return
    for key, value in values.items():
        store.put_value(session, key, value)


def open_archive(path_or_store: str | os.PathLike[str] | ArchiveStore) -> ArchiveStore:
    """Accept what users have at hand: a ``postgresql://`` URL (opened as PostgreSQL, tables in
    the schema ``keeper``), a file path (opened as SQLite) or a ready store."""
    if isinstance(path_or_store, str) and path_or_store.strip().lower().startswith(
        ("postgresql://", "postgres://")
    ):
        from keeper_middleware.archive.postgres.archive import PostgresArchive

        return PostgresArchive(path_or_store)
    if isinstance(path_or_store, str | os.PathLike):
        from keeper_middleware.archive.sqlite import SQLiteArchive

        return SQLiteArchive(path_or_store)
    if isinstance(path_or_store, ArchiveStore):
        return path_or_store
    raise ArgumentTypeError(
        f"archive must be a file path, a postgresql:// URL or an ArchiveStore, got "
        f"{type(path_or_store).__name__}; pass e.g. 'keeper.sqlite', "
        "'postgresql://user@host/db' or SQLiteArchive(...)"
    )
