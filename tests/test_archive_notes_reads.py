"""Reading what a request starts from never waits behind another session's save: a branch with
no cut yet is answered without the archive's lock, a session's values (the search guard, the
counters, a proxy's record) are read on a connection of their own, and the answers stay right
while cuts and saves commit in another thread."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from keeper_middleware.archive.records import TIP, NotesDraft
from keeper_middleware.archive.sqlite.archive import SQLiteArchive


@pytest.mark.parametrize(
    ("read", "expected"),
    [
        (lambda archive: archive.notes_at("s", None), None),
        (lambda archive: archive.get_value("s", "search_guard"), {"repeats": 2}),
    ],
    ids=["no cut yet", "a value"],
)
def test_reads_are_answered_while_another_thread_holds_the_archive(
    tmp_path, read: Callable[[SQLiteArchive], object], expected: object
) -> None:
    archive = SQLiteArchive(str(tmp_path / "a.db"))
    archive.put_value("s", "search_guard", {"repeats": 1})
    archive.put_value("s", "search_guard", {"repeats": 2})
    holding, release = threading.Event(), threading.Event()

    def save_in_progress() -> None:
        with archive._lock:  # as another session's save holds it while it commits
            holding.set()
            release.wait(30)

    saver = threading.Thread(target=save_in_progress)
    saver.start()
    holding.wait(30)
    answers: list[object] = []
    reader = threading.Thread(target=lambda: answers.append(read(archive)))
    reader.start()
    reader.join(30)
    still_waiting = reader.is_alive()
    release.set()
    saver.join()
    reader.join()
    archive.close()
    assert not still_waiting and answers == [expected]


def test_the_latest_notes_follow_cuts_committed_in_another_thread(tmp_path) -> None:
    archive = SQLiteArchive(str(tmp_path / "a.db"))
    committed = threading.Event()
    seen: list[int] = []

    def cuts() -> None:
        for n in range(1, 31):
            draft = NotesDraft(first_item=0, last_item=n, text=f"notes {n}")
            archive.commit_cut("s", cut_key=f"cut-{n}", turns=(), notes=draft)
        committed.set()

    writer = threading.Thread(target=cuts)
    writer.start()
    while not committed.is_set():
        latest = archive.notes_at("s", TIP)
        seen.append(0 if latest is None else latest.version)
        assert archive.notes_at("s", None) is None
    writer.join()
    final = archive.notes_at("s", TIP)
    archive.close()
    assert seen == sorted(seen)  # never an older version after a newer one
    assert final is not None and final.version == 30 and final.text == "notes 30"


def test_a_value_read_while_saves_commit_in_another_thread_is_never_older_than_the_last_save(
    tmp_path,
) -> None:
    archive = SQLiteArchive(str(tmp_path / "a.db"))
    done = threading.Event()

    def saves() -> None:
        for n in range(1, 201):
            archive.put_values("other", {"record": list(range(n))})
        done.set()

    writer = threading.Thread(target=saves)
    writer.start()
    n = 0
    while not done.is_set():
        n += 1
        archive.put_value("s", "counters", {"steps": n})
        assert archive.get_value("s", "counters") == {"steps": n}  # its own write, at once
    writer.join()
    assert archive.get_value("other", "record") == list(range(200))
    archive.close()
