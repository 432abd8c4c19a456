"""Where an archive's search indexes live, derived from the archive itself.

A retriever on a shared server (Chroma, PostgreSQL) must find the same passages again when the
same archive is reopened, and never another archive's: the name is derived from where the
archive is, never from the process that opened it.
"""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

from keeper_middleware.archive.postgres.archive import PostgresArchive
from keeper_middleware.archive.postgres.connect import redact_url
from keeper_middleware.archive.store import ArchiveStore


def archive_namespace(archive: ArchiveStore | str | Path) -> str:
    """A server collection name of one archive: the file's absolute path hashed (the same file
    reopened finds its passages again); an in-memory archive gets a name of its own; a
    PostgreSQL archive its server, database and schema hashed (without the password), so every
    replica of one archive shares its collection."""
    if isinstance(archive, PostgresArchive):
        where_db = f"{redact_url(archive.url)}#{archive.schema}"
        return f"keeper-{hashlib.sha256(where_db.encode()).hexdigest()[:16]}"
    where = archive if isinstance(archive, str | Path) else getattr(archive, "path", None)
    if where is None or str(where) == ":memory:":
        return f"keeper-{uuid.uuid4().hex[:16]}"
    digest = hashlib.sha256(str(Path(where).resolve()).encode()).hexdigest()[:16]
    return f"keeper-{digest}"


def database_of(archive: ArchiveStore) -> tuple[str | None, str]:
    """(URL, schema) of an archive kept in a database, so its keyword index can live beside it."""
    if isinstance(archive, PostgresArchive):
        return archive.url, archive.schema
    return None, "keeper"
