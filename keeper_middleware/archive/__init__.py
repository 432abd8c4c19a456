"""The archive: every turn that leaves the live window, word for word, never edited.

``records`` holds what the archive keeps (turns, NOTES versions, cut records, moved entries),
``store`` the storage contract every backend meets (``ArchiveStore``, ``open_archive``), ``rows``
the rows a cut writes in any SQL store, and ``cli`` the ``keeper-archive`` command. The backends
are their own packages: ``keeper_middleware.archive.sqlite`` (one file, the embedded default) and
``keeper_middleware.archive.postgres`` (one database shared by workers and replicas).

Only the records and the contract are imported here: the backends import this package, so it
must not import them back.
"""

from keeper_middleware.archive.records import (
    ROLES,
    ArchivedTurn,
    CutRecord,
    MovedUpdate,
    NotesDraft,
    NotesVersion,
    turn_from_message,
)
from keeper_middleware.archive.store import (
    SCHEMA_VERSION,
    ArchiveSchemaError,
    ArchiveStore,
    open_archive,
    put_values,
)
from keeper_middleware.errors import ArchiveError

__all__ = [
    "ROLES",
    "SCHEMA_VERSION",
    "ArchiveError",
    "ArchiveSchemaError",
    "ArchiveStore",
    "ArchivedTurn",
    "CutRecord",
    "MovedUpdate",
    "NotesDraft",
    "NotesVersion",
    "open_archive",
    "put_values",
    "turn_from_message",
]
