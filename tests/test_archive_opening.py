"""Opening an archive: a SQLite file is in WAL mode and its folder is made; a file from a newer
schema, a file that is not an archive, a closed archive and bad turns or notes are refused with
an error that says what to do; ``open_archive`` takes a path or a store."""

from __future__ import annotations

import sqlite3

import pytest

from keeper_middleware.archive.records import ArchivedTurn, NotesDraft
from keeper_middleware.archive.sqlite import SQLiteArchive
from keeper_middleware.archive.store import SCHEMA_VERSION, ArchiveSchemaError, open_archive
from keeper_middleware.errors import ArchiveError
from tests.archive_stores import (
    open_store,
    spec_fixture,  # noqa: F401
    store_fixture,  # noqa: F401
)


def test_the_file_is_in_wal_mode(tmp_path):
    path = tmp_path / "a.sqlite"
    SQLiteArchive(path, synchronous="FULL").close()
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with pytest.raises(ValueError, match="NORMAL"):
        SQLiteArchive(path, synchronous="OFF")  # type: ignore[arg-type]


def test_the_parent_folder_of_a_new_file_is_created(tmp_path):
    path = tmp_path / "deep" / "er" / "keeper.sqlite"
    SQLiteArchive(path).close()
    assert path.exists()


def test_a_file_from_a_newer_schema_is_refused_with_a_clear_error(tmp_path):
    path = tmp_path / "a.sqlite"
    SQLiteArchive(path).close()
    with sqlite3.connect(path) as raw:
        raw.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION + 1,))
    with pytest.raises(ArchiveSchemaError, match="upgrade keeper-middleware"):
        SQLiteArchive(path)


def test_a_file_that_is_not_an_archive_is_refused(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"this is not a database, " * 100)
    with pytest.raises(ArchiveError, match="cannot open the archive"):
        SQLiteArchive(path)
    assert path.read_bytes() == b"this is not a database, " * 100


def test_a_closed_archive_says_so(spec):
    archive = open_store(spec)
    archive.close()
    archive.close()
    with pytest.raises(ArchiveError, match="closed"):
        archive.turn_count("s")
    with pytest.raises(ArchiveError, match="closed"):
        list(archive.turns("s"))


def test_open_archive_takes_a_path_or_a_store(tmp_path, store):
    assert open_archive(store) is store
    opened = open_archive(tmp_path / "x.sqlite")
    assert isinstance(opened, SQLiteArchive)
    opened.close()
    with pytest.raises(TypeError, match="file path, a postgresql:// URL or an ArchiveStore"):
        open_archive(42)  # type: ignore[arg-type]


def test_bad_turns_and_notes_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="give every message an id"):
        ArchivedTurn(session="s", msg_id="", item=1, role="ai", content="x")
    with pytest.raises(ValueError, match="role must be one of"):
        ArchivedTurn(session="s", msg_id="m", item=1, role="assistant", content="x")
    with pytest.raises(ValueError, match="JSON list"):
        ArchivedTurn(session="s", msg_id="m", item=1, role="ai", content="x", tool_calls_json="{}")
    with pytest.raises(TypeError, match="pass the text"):
        ArchivedTurn(session="s", msg_id="m", item=1, role="ai", content=["x"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="both be set"):
        NotesDraft(first_item=1, last_item=None, text="")
    with pytest.raises(ValueError, match="after last_item"):
        NotesDraft(first_item=5, last_item=2, text="")
    with pytest.raises(ValueError, match="non-empty string"):
        SQLiteArchive(":memory:").commit_cut("", cut_key="k", turns=(), notes=None)
