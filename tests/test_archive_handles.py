"""Handles (``archive.handles``): an opaque name kept for a session, found again by any process
on the archive, never given twice, erased with its session; an SQLite file of layout 3 gains the
table when opened. Both backends."""

from __future__ import annotations

import sqlite3

import pytest

from keeper_middleware.archive.handles import HandleStore
from keeper_middleware.archive.sqlite import SQLiteArchive
from keeper_middleware.archive.store import SCHEMA_VERSION
from keeper_middleware.errors import ArchiveError


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def opened(request, tmp_path):
    """A way to open the same archive again (a restart, or another replica)."""
    if request.param == "sqlite":
        return lambda: SQLiteArchive(tmp_path / "archive.sqlite3")
    from keeper_middleware.archive.postgres import PostgresArchive

    url, schema = request.getfixturevalue("postgres_url"), request.getfixturevalue("pg_schema")
    return lambda: PostgresArchive(url, schema=schema)


def test_a_handle_is_found_again_from_another_opening_and_leaves_with_its_session(opened):
    with opened() as first:
        assert isinstance(first, HandleStore)
        first.put_handle("acme:s1", "h-1", {"reply": "r-1", "stored": True})
        first.put_handle("acme:s2", "h-2", ["ok"])
        with pytest.raises(ArchiveError, match="already taken"):
            first.put_handle("beta:s9", "h-1", {})
    with opened() as second:
        assert second.find_handle("h-1") == ("acme:s1", {"reply": "r-1", "stored": True})
        assert second.find_handle("never") is None
        second.delete_session("acme:s1")
        assert second.find_handle("h-1") is None
        assert second.find_handle("h-2") == ("acme:s2", ["ok"])


def test_a_file_of_layout_3_gains_the_handles_table_when_opened(tmp_path):
    path = tmp_path / "old.sqlite3"
    SQLiteArchive(path).close()
    with sqlite3.connect(path) as raw:
        raw.execute("DROP TABLE handles")
        raw.execute("UPDATE schema_version SET version = 3")
    with SQLiteArchive(path) as archive:
        archive.put_handle("s", "h", 1)
        assert archive.find_handle("h") == ("s", 1)
    with sqlite3.connect(path) as raw:
        assert raw.execute("SELECT version FROM schema_version").fetchone() == (SCHEMA_VERSION,)
