"""The archive keeps every turn exactly once, its notes match it, and a crash never splits a cut."""

from __future__ import annotations

import inspect
import json
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import tracemalloc

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from keeper_middleware.archive import (
    SCHEMA_VERSION,
    ArchivedTurn,
    ArchiveError,
    ArchiveSchemaError,
    ArchiveStore,
    MovedUpdate,
    NotesDraft,
    open_archive,
    put_values,
    turn_from_message,
)
from keeper_middleware.moved_rows import LEGACY_ENTRIES, LEGACY_KEYS, words_of
from keeper_middleware.sqlite import SQLiteArchive


def make_turns(session: str, cut: int, count: int = 3, *, size: int = 20) -> list[ArchivedTurn]:
    """Turns whose msg_id names the cut they belong to, so an audit can group them."""
    return [
        ArchivedTurn(
            session=session,
            msg_id=f"c{cut}-t{j}",
            item=cut,
            role="human" if j % 2 == 0 else "ai",
            content=f"cut {cut} turn {j} " + "x" * size,
        )
        for j in range(count)
    ]


def notes_for(cut: int) -> NotesDraft:
    return NotesDraft(
        first_item=0,
        last_item=cut,
        text=f"[NOTES] after cut {cut}",
        data_json=json.dumps({"cut": cut}),
    )


def audit(store: ArchiveStore, session: str) -> dict[int, int]:
    """Check every invariant a crash could break; return turns per committed cut."""
    turns = list(store.turns(session))
    assert [t.seq for t in turns] == list(range(len(turns))), "seq must be gap-free"
    assert len({t.msg_id for t in turns}) == len(turns), "no turn twice"
    per_cut: dict[int, int] = {}
    for turn in turns:
        cut = int(turn.msg_id.split("-")[0][1:])
        per_cut[cut] = per_cut.get(cut, 0) + 1
    versions = list(store.notes_versions(session))
    assert [v.version for v in versions] == list(range(1, len(versions) + 1))
    for cut, count in per_cut.items():
        record = store.find_cut(session, f"cut-{cut}")
        assert record is not None, f"turns of cut {cut} are archived but the cut is not recorded"
        assert record.turns_archived == count
        assert record.notes_version is not None
        assert versions[record.notes_version - 1].cut_key == f"cut-{cut}"
    assert {int(v.cut_key.split("-")[1]) for v in versions} == set(per_cut)
    return per_cut


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def spec(request, tmp_path) -> str:
    """Where a store lives, as a string a child process can open too."""
    if request.param == "sqlite":
        return f"sqlite:{tmp_path / 'deep' / 'er' / 'keeper.sqlite'}"
    url = request.getfixturevalue("postgres_url")
    return f"postgres:{request.getfixturevalue('pg_schema')}:{url}"


def open_store(spec: str) -> ArchiveStore:
    kind, _, where = spec.partition(":")
    if kind == "sqlite":
        return SQLiteArchive(where)
    from keeper_middleware.postgres import PostgresArchive

    schema, _, url = where.partition(":")
    return PostgresArchive(url, schema=schema)


@pytest.fixture
def store(spec):
    with open_store(spec) as archive:
        yield archive


def test_a_cut_archives_turns_word_for_word_in_order(store):
    turns = make_turns("s", 1, 4)
    record = store.commit_cut("s", cut_key="cut-1", turns=turns, notes=notes_for(1))
    assert record.turns_archived == 4
    assert record.notes_version == 1
    stored = list(store.turns("s"))
    assert [t.seq for t in stored] == [0, 1, 2, 3]
    assert [(t.msg_id, t.content, t.role) for t in stored] == [
        (t.msg_id, t.content, t.role) for t in turns
    ]
    assert store.turn_count("s") == 4
    assert store.latest_notes("s").text == "[NOTES] after cut 1"


def test_committing_a_cut_key_twice_returns_the_first_record_and_changes_nothing(store):
    first = store.commit_cut("s", cut_key="cut-1", turns=make_turns("s", 1), notes=notes_for(1))
    again = store.commit_cut("s", cut_key="cut-1", turns=make_turns("s", 2), notes=notes_for(2))
    assert again == first
    assert store.turn_count("s") == 3
    assert len(list(store.notes_versions("s"))) == 1


def test_a_turn_already_archived_is_skipped_never_duplicated(store):
    store.commit_cut("s", cut_key="cut-1", turns=make_turns("s", 1), notes=None)
    record = store.commit_cut(
        "s", cut_key="cut-2", turns=[*make_turns("s", 1), *make_turns("s", 2)], notes=None
    )
    assert record.turns_archived == 3
    assert store.turn_count("s") == 6
    assert store.archived_ids("s", ["c1-t0", "c2-t2", "never"]) == {"c1-t0", "c2-t2"}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_turn_count_is_the_turns_stored_whatever_mix_of_cuts_made_them(store, seed):
    rng = random.Random(seed)
    for cut in range(1, 13):  # new turns, turns archived before, a cut key committed again
        turns = make_turns("s", cut, rng.randint(0, 5))
        if cut > 1 and rng.random() < 0.5:
            turns = [*make_turns("s", rng.randint(1, cut - 1), 2), *turns]
        key = f"cut-{rng.randint(1, cut)}"
        store.commit_cut("s", cut_key=key, turns=turns, notes=None)
        assert store.turn_count("s") == len(list(store.turns("s")))
    store.delete_session("s")
    assert store.turn_count("s") == 0
    store.commit_cut("s", cut_key="again", turns=make_turns("s", 99, 2), notes=None)
    assert store.turn_count("s") == 2 == len(list(store.turns("s")))


def test_two_different_turns_under_one_id_in_a_cut_are_refused(store):
    a, b = make_turns("s", 1, 1), make_turns("s", 2, 1)
    clash = [a[0], ArchivedTurn(**{**_fields(b[0]), "msg_id": a[0].msg_id})]
    with pytest.raises(ValueError, match="share msg_id"):
        store.commit_cut("s", cut_key="cut-1", turns=clash, notes=None)
    assert store.commit_cut("s", cut_key="cut-1", turns=a + a, notes=None).turns_archived == 1


def test_a_turn_of_another_session_is_refused(store):
    with pytest.raises(ValueError, match="session 'other'"):
        store.commit_cut("s", cut_key="k", turns=make_turns("other", 1), notes=None)


def _fields(turn: ArchivedTurn) -> dict[str, object]:
    return {name: getattr(turn, name) for name in ArchivedTurn.__slots__}


def test_turns_filter_by_inclusive_item_range_and_after_seq(store):
    store.commit_cut(
        "s",
        cut_key="setup",
        turns=[ArchivedTurn(session="s", msg_id="sys", item=None, role="system", content="task")],
        notes=None,
    )
    for cut in (1, 2, 3, 4):
        store.commit_cut("s", cut_key=f"cut-{cut}", turns=make_turns("s", cut, 2), notes=None)
    assert {t.item for t in store.turns("s", from_item=2, to_item=3)} == {2, 3}
    assert [t.item for t in store.turns("s", to_item=1)] == [1, 1]
    assert [t.seq for t in store.turns("s", after_seq=6)] == [7, 8]
    assert next(store.turns("s")).item is None


def test_reopening_continues_seq_and_notes_versions(spec):
    with open_store(spec) as first:
        first.commit_cut("s", cut_key="cut-1", turns=make_turns("s", 1), notes=notes_for(1))
    with open_store(spec) as second:
        record = second.commit_cut(
            "s", cut_key="cut-2", turns=make_turns("s", 2), notes=notes_for(2)
        )
        assert record.notes_version == 2
        assert [t.seq for t in second.turns("s")] == list(range(6))
        assert second.find_cut("s", "cut-1").turns_archived == 3
        audit(second, "s")


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


def test_notes_versions_stream_instead_of_loading_every_version(spec):
    with open_store(spec) as archive:
        big = "n" * 1_000_000
        for cut in range(40):
            draft = NotesDraft(first_item=0, last_item=cut, text=f"{cut} {big}")
            archive.commit_cut("s", cut_key=f"cut-{cut}", turns=(), notes=draft)
        tracemalloc.start()
        try:
            seen = sum(1 for _ in archive.notes_versions("s"))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert seen == 40
    assert peak < 20_000_000, f"peak {peak} bytes: versions were loaded together (40 MB in all)"


def test_unicode_and_a_megabyte_of_content_round_trip_word_for_word(store):
    text = "Zürich ✓ 日本語 😀 a\x00b \u2028 " + "ω" * 1_000_000
    turn = ArchivedTurn(
        session="s",
        msg_id="m",
        item=1,
        role="ai",
        content=text,
        tool_calls_json=json.dumps([{"name": "search_archive", "args": {"query": "δ"}, "id": "c"}]),
        name="bot",
        reasoning="thinking… " + text,
    )
    store.commit_cut("s", cut_key="k", turns=[turn], notes=None)
    assert next(store.turns("s")) == ArchivedTurn(**{**_fields(turn), "seq": 0})


def test_values_are_upserted_per_session_and_must_be_json(store):
    assert store.get_value("s", "guard") is None
    store.put_value("s", "guard", {"repeats": 1, "last": "domo86"})
    store.put_value("s", "guard", {"repeats": 2, "last": "domo86"})
    store.put_value("t", "guard", [1])
    assert store.get_value("s", "guard") == {"repeats": 2, "last": "domo86"}
    assert store.get_value("t", "guard") == [1]
    with pytest.raises(TypeError, match="JSON-able"):
        store.put_value("s", "bad", object())
    with pytest.raises(TypeError, match="JSON-able"):
        store.put_value("s", "bad", float("nan"))


def test_several_values_are_written_all_or_none(store):
    store.put_value("s", "kept", "before")
    put_values(store, "s", {"a": 1, "b": [2, "two"], "kept": "after"})
    assert [store.get_value("s", k) for k in ("a", "b", "kept")] == [1, [2, "two"], "after"]
    with pytest.raises(TypeError, match="JSON-able"):
        put_values(store, "s", {"a": 10, "bad": object(), "kept": "lost"})
    assert (store.get_value("s", "a"), store.get_value("s", "kept")) == (1, "after")
    assert store.get_value("s", "bad") is None


class _OneValueAtATime:
    """A store with only ``put_value`` (as a backend without batches would be)."""

    def __init__(self, inner: SQLiteArchive) -> None:
        self.inner = inner
        self.writes: list[str] = []

    def put_value(self, session: str, key: str, value: object) -> None:
        self.writes.append(key)
        self.inner.put_value(session, key, value)


def test_a_store_without_batches_gets_the_values_one_by_one_in_order(store):
    plain = _OneValueAtATime(store)
    put_values(plain, "s", {"chunk": [1], "head": {"n": 1}, "old": None})  # type: ignore[arg-type]
    assert plain.writes == ["chunk", "head", "old"]
    assert store.get_value("s", "head") == {"n": 1}


def test_delete_session_removes_only_that_session(store):
    for session in ("a", "b"):
        store.commit_cut(session, cut_key="cut-1", turns=make_turns(session, 1), notes=notes_for(1))
        store.put_value(session, "k", 1)
    assert store.sessions() == ["a", "b"]
    store.delete_session("a")
    assert store.sessions() == ["b"]
    assert (store.turn_count("a"), store.latest_notes("a"), store.get_value("a", "k")) == (
        0,
        None,
        None,
    )
    assert store.find_cut("a", "cut-1") is None
    assert store.turn_count("b") == 3
    store.commit_cut("a", cut_key="cut-1", turns=make_turns("a", 1), notes=notes_for(1))
    assert [t.seq for t in store.turns("a")] == [0, 1, 2]


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


def test_archived_ids_answers_for_many_ids_at_once(store):
    turns = [
        ArchivedTurn(session="s", msg_id=f"m{i}", item=1, role="human", content="x")
        for i in range(1_200)
    ]
    store.commit_cut("s", cut_key="k", turns=turns, notes=None)
    asked = [f"m{i}" for i in range(0, 2_400, 2)]
    assert store.archived_ids("s", asked) == {f"m{i}" for i in range(0, 1_200, 2)}


def test_turn_from_message_keeps_tool_calls_and_reasoning_apart():
    ai = AIMessage(
        content=[{"type": "text", "text": "Let me look."}],
        id="a1",
        tool_calls=[{"name": "search_archive", "args": {"query": "domo86"}, "id": "call-1"}],
        additional_kwargs={"reasoning_content": "The value is old."},
    )
    turn = turn_from_message(ai, session="s", item=7)
    assert (turn.role, turn.content, turn.reasoning, turn.item) == (
        "ai",
        "Let me look.",
        "The value is old.",
        7,
    )
    assert json.loads(turn.tool_calls_json)[0]["args"] == {"query": "domo86"}
    tool = turn_from_message(
        ToolMessage("Found 2 matches", tool_call_id="call-1", name="search_archive", id="t1"),
        session="s",
        item=7,
    )
    assert (tool.role, tool.tool_call_id, tool.name) == ("tool", "call-1", "search_archive")
    with pytest.raises(ValueError, match="give every message an id"):
        turn_from_message(HumanMessage("no id"), session="s", item=None)


def test_a_failure_inside_a_cut_leaves_no_part_of_it(store, monkeypatch):
    store.commit_cut("s", cut_key="cut-1", turns=make_turns("s", 1), notes=notes_for(1))

    def fail(session: str, cut_key: str) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(store, "_before_commit", fail)
    with pytest.raises(OSError, match="disk gone"):
        store.commit_cut("s", cut_key="cut-2", turns=make_turns("s", 2), notes=notes_for(2))
    assert store.find_cut("s", "cut-2") is None
    assert audit(store, "s") == {1: 3}
    monkeypatch.undo()
    assert (
        store.commit_cut(
            "s", cut_key="cut-2", turns=make_turns("s", 2), notes=notes_for(2)
        ).notes_version
        == 2
    )
    assert audit(store, "s") == {1: 3, 2: 3}


WRITER_IMPORTS = """
import json, os, signal, sys
from keeper_middleware.archive import ArchiveStore, ArchivedTurn, NotesDraft
from keeper_middleware.sqlite import SQLiteArchive
"""
WRITER = textwrap.dedent(
    """
    spec, session = sys.argv[1], sys.argv[2]
    cuts, die_at, size, first = (int(arg) for arg in sys.argv[3:])
    archive = open_store(spec)
    if die_at >= 0:
        def die(s, key):
            if key == f"cut-{die_at}":
                os.kill(os.getpid(), signal.SIGKILL)
        archive._before_commit = die
    for cut in range(first, first + cuts):
        turns = make_turns(session, cut, 5, size=size)
        archive.commit_cut(session, cut_key=f"cut-{cut}", turns=turns, notes=notes_for(cut))
        print(cut, flush=True)
    """
)


def writer(
    spec: str, session: str, cuts: int, *, die_at: int = -1, size: int = 20, first: int = 0
) -> subprocess.Popen[str]:
    """A separate Python process committing ``cuts`` cuts to the store, printing each cut done."""
    args = [spec, session, str(cuts), str(die_at), str(size), str(first)]
    helpers = [make_turns, notes_for, open_store]
    script = WRITER_IMPORTS + "".join(inspect.getsource(f) for f in helpers) + WRITER
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        text=True,
    )


def test_a_process_killed_in_the_middle_of_a_cut_leaves_the_cut_out_whole(spec):
    child = writer(spec, "s", cuts=10, die_at=6)
    child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL
    with open_store(spec) as archive:
        assert audit(archive, "s") == {cut: 5 for cut in range(6)}
        for cut in range(10):  # replaying every cut after the crash completes the archive once
            archive.commit_cut(
                "s", cut_key=f"cut-{cut}", turns=make_turns("s", cut, 5), notes=notes_for(cut)
            )
        assert audit(archive, "s") == {cut: 5 for cut in range(10)}


def test_a_process_killed_at_an_arbitrary_moment_never_splits_a_cut(spec):
    child = writer(spec, "s", cuts=10_000, size=20_000)
    assert child.stdout is not None
    for _ in range(5):
        child.stdout.readline()
    child.kill()
    child.wait(timeout=60)
    with open_store(spec) as archive:
        done = audit(archive, "s")
        assert len(done) >= 5
        assert set(done) == set(range(len(done)))


def test_two_threads_sharing_one_archive_keep_seq_gap_free(spec):
    shared = open_store(spec)
    own = open_store(spec)

    def write(archive: ArchiveStore, first: int) -> None:
        for cut in range(first, first + 20):
            archive.commit_cut(
                "s", cut_key=f"cut-{cut}", turns=make_turns("s", cut), notes=notes_for(cut)
            )

    threads = [
        threading.Thread(target=write, args=(shared, 0)),
        threading.Thread(target=write, args=(shared, 100)),
        threading.Thread(target=write, args=(own, 200)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(audit(shared, "s")) == 60
    shared.close()
    own.close()


def test_two_processes_writing_one_store_do_not_corrupt_it(spec):
    open_store(spec).close()
    children = [writer(spec, "s", cuts=25, first=first) for first in (0, 100)]
    for child in children:
        child.communicate(timeout=120)
        assert child.returncode == 0
    with open_store(spec) as archive:
        expected = {cut: 5 for cut in [*range(25), *range(100, 125)]}
        assert audit(archive, "s") == expected
    if spec.startswith("sqlite:"):
        with sqlite3.connect(spec.partition(":")[2]) as raw:
            assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


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
    with SQLiteArchive(path) as archive:
        archive.commit_cut("s", cut_key="cut-1", turns=make_turns("s", 1), notes=notes_for(1))
        archive.put_value("s", LEGACY_KEYS, ["c1"])
        archive.put_value("s", LEGACY_ENTRIES, {"c1": "3"})
    raw = sqlite3.connect(path)  # as the previous version wrote it: no table of moved entries
    raw.execute("DROP TABLE moved")
    raw.execute("UPDATE schema_version SET version = 1")
    raw.commit()
    raw.close()
    with SQLiteArchive(path) as archive:
        assert list(archive.moved_rows("s")) == [("c1", "3")]
        assert archive.turn_count("s") == 3
    with sqlite3.connect(path) as raw:
        assert raw.execute("SELECT version FROM schema_version").fetchone() == (2,)
