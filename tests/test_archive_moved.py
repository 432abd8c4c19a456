"""Moved NOTES entries are one row each, read by the words of a text and written with the cut:
their order, values and lookups hold, drop/forget/add follow the NOTES, sessions never see each
other's, a replayed or failed cut changes them once or not at all, any text round-trips, and a
session or file from the earlier layout (two JSON values, no table) moves to rows on first use."""

from __future__ import annotations

import sqlite3

import pytest

from keeper_middleware.archive.moved_rows import LEGACY_ENTRIES, LEGACY_KEYS, words_of
from keeper_middleware.archive.records import MovedUpdate
from keeper_middleware.archive.sqlite import SQLiteArchive
from keeper_middleware.archive.store import SCHEMA_VERSION
from tests.archive_stores import (
    make_turns,
    notes_for,
    open_store,
    spec_fixture,  # noqa: F401
    store_fixture,  # noqa: F401
)
from tests.legacy_layouts import write_v1

# -- moved NOTES entries: one row each, read by the words of a text, written with the cut -----


def cut(archive, session: str, n: int, moved: MovedUpdate | None):
    return archive.commit_cut(
        session,
        cut_key=f"cut-{n}",
        turns=make_turns(session, n),
        notes=notes_for(n),
        moved=moved,
    )


def test_moved_entries_keep_their_order_values_and_lookups(store):
    cut(store, "s", 1, MovedUpdate(add=(("c1", "3"), ("Ada Fenn", "7"), ("Łódź kasa", "12"))))
    cut(store, "s", 2, MovedUpdate(add=(("c2", "6"), ("c1", "4"))))  # c1 moved again: to the end
    assert list(store.moved_rows("s")) == [
        ("Ada Fenn", "7"),
        ("Łódź kasa", "12"),
        ("c2", "6"),
        ("c1", "4"),
    ]
    # by the first case-folded word of the key, in the order they moved
    assert store.moved_named("s", {"ada", "c1", "łódź"}) == [
        ("Ada Fenn", "7"),
        ("Łódź kasa", "12"),
        ("c1", "4"),
    ]
    assert store.moved_named("s", {"fenn", "kasa"}) == []  # not a first word
    assert store.moved_named("s", set()) == []
    assert store.moved_among("s", {"ada fenn", "c2", "nothing"}) == ["Ada Fenn", "c2"]


def test_drop_forget_and_add_follow_the_notes(store):
    cut(store, "s", 1, MovedUpdate(add=(("a", "1"), ("b", "2"), ("c", "3"))))
    # a back in the NOTES, b unset after a recall: its key stays archived, with nothing to recall
    cut(store, "s", 2, MovedUpdate(drop=("a", "zz"), forget=("b",), add=(("d", "4"),)))
    assert list(store.moved_rows("s")) == [("b", None), ("c", "3"), ("d", "4")]
    assert store.moved_named("s", {"a", "b", "c", "d"}) == [("c", "3"), ("d", "4")]
    assert store.moved_among("s", {"a", "b"}) == ["b"]
    store.update_moved("s", MovedUpdate(add=(("b", "9"),)))  # moved out again: a value again
    assert store.moved_named("s", {"b"}) == [("b", "9")]


def test_sessions_never_see_each_others_entries(store):
    cut(store, "s1", 1, MovedUpdate(add=(("c1", "1"),)))
    cut(store, "s2", 1, MovedUpdate(add=(("c1", "2"), ("c2", "5"))))
    cut(store, "s2", 2, MovedUpdate(drop=("c1",)))
    assert list(store.moved_rows("s1")) == [("c1", "1")]
    assert list(store.moved_rows("s2")) == [("c2", "5")]
    assert store.moved_named("s1", {"c2"}) == []
    store.delete_session("s1")
    assert list(store.moved_rows("s1")) == []
    assert list(store.moved_rows("s2")) == [("c2", "5")]


def test_a_cut_committed_twice_changes_the_moved_entries_once(store):
    cut(store, "s", 1, MovedUpdate(add=(("c1", "1"), ("c2", "2"))))
    cut(store, "s", 2, MovedUpdate(drop=("c1",), add=(("c3", "3"),)))
    cut(store, "s", 2, MovedUpdate(drop=("c2",), add=(("c9", "9"),)))  # a replay: no change
    assert list(store.moved_rows("s")) == [("c2", "2"), ("c3", "3")]


def test_a_failure_inside_a_cut_leaves_the_moved_entries_as_they_were(store, monkeypatch):
    cut(store, "s", 1, MovedUpdate(add=(("c1", "1"),)))

    def fail(session: str, cut_key: str) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(store, "_before_commit", fail)
    with pytest.raises(OSError, match="disk gone"):
        cut(store, "s", 2, MovedUpdate(drop=("c1",), add=(("c2", "2"),)))
    assert list(store.moved_rows("s")) == [("c1", "1")]
    monkeypatch.undo()
    cut(store, "s", 2, MovedUpdate(drop=("c1",), add=(("c2", "2"),)))
    assert list(store.moved_rows("s")) == [("c2", "2")]


def test_moved_entries_survive_reopening(spec):
    with open_store(spec) as archive:
        cut(archive, "s", 1, MovedUpdate(add=(("c1", "1"), ("Zoë Ng", "2"))))
    with open_store(spec) as archive:
        assert list(archive.moved_rows("s")) == [("c1", "1"), ("Zoë Ng", "2")]
        assert archive.moved_named("s", words_of("zoë was here")) == [("Zoë Ng", "2")]


def test_any_text_round_trips_as_a_key_or_value(store):
    odd = [("naïve\u200bkey", "v\x00nul"), ("漢字 キー", "値"), ("🙂 smile", "a\nb")]
    store.update_moved("s", MovedUpdate(add=tuple(odd)))
    assert list(store.moved_rows("s")) == odd
    assert store.moved_named("s", words_of("漢字 and smile")) == odd[1:]  # 🙂 is not a word


def test_bad_updates_are_refused_with_the_field_named():
    with pytest.raises(ValueError, match="drop keys must be non-empty strings"):
        MovedUpdate(drop=("",))
    with pytest.raises(TypeError, match="must be str or None"):
        MovedUpdate(add=(("c1", 3),))  # type: ignore[arg-type]


def test_a_session_stored_as_two_json_values_moves_to_rows_on_first_use(spec):
    with open_store(spec) as archive:
        archive.put_value("old", LEGACY_KEYS, ["c1", "c2", "c3", "gone"])
        archive.put_value("old", LEGACY_ENTRIES, {"c1": "3", "c2": "6", "c3": "9"})
        archive.put_value("old", "counters", {"cuts": 4})
    with open_store(spec) as archive:
        assert archive.moved_named("old", {"c2", "gone"}) == [("c2", "6")]
        assert archive.moved_among("old", {"gone"}) == ["gone"]  # moved, nothing to recall
        assert archive.get_value("old", LEGACY_KEYS) is None
        assert archive.get_value("old", LEGACY_ENTRIES) is None
        assert archive.get_value("old", "counters") == {"cuts": 4}
    with open_store(spec) as archive:  # read once: a later process finds the rows
        assert dict(archive.moved_rows("old")) == {"gone": None, "c1": "3", "c2": "6", "c3": "9"}


def test_old_values_are_adopted_before_a_cut_changes_them(spec):
    with open_store(spec) as archive:
        archive.put_value("old", LEGACY_KEYS, ["c1", "c2"])
        archive.put_value("old", LEGACY_ENTRIES, {"c1": "3", "c2": "6"})
    with open_store(spec) as archive:
        cut(archive, "old", 1, MovedUpdate(drop=("c1",), add=(("c4", "12"),)))
        assert list(archive.moved_rows("old")) == [("c2", "6"), ("c4", "12")]
        assert archive.get_value("old", LEGACY_ENTRIES) is None


def test_a_file_of_the_first_layout_opens_and_keeps_its_moved_entries(tmp_path):
    path = tmp_path / "v1.sqlite3"
    write_v1(path, "s", [("cut-1", make_turns("s", 1), notes_for(1))])  # no table of moved entries
    raw = sqlite3.connect(path)
    raw.execute(
        "INSERT INTO kv VALUES ('s', ?, '[\"c1\"]'), ('s', ?, '{\"c1\": \"3\"}')",
        (LEGACY_KEYS, LEGACY_ENTRIES),
    )
    raw.commit()
    raw.close()
    with SQLiteArchive(path) as archive:
        assert list(archive.moved_rows("s")) == [("c1", "3")]
        assert archive.turn_count("s") == 3
    with sqlite3.connect(path) as raw:
        assert raw.execute("SELECT version FROM schema_version").fetchone() == (SCHEMA_VERSION,)
