"""Reading the NOTES a step starts from never waits behind another session's save: a branch with
no cut yet is answered without the archive's lock, and the latest NOTES stay right while cuts
commit in another thread."""

from __future__ import annotations

import threading

from keeper_middleware.archive.records import TIP, NotesDraft
from keeper_middleware.archive.sqlite.archive import SQLiteArchive


def test_a_branch_with_no_cut_is_answered_while_another_thread_holds_the_archive(
    tmp_path,
) -> None:
    archive = SQLiteArchive(str(tmp_path / "a.db"))
    holding, release = threading.Event(), threading.Event()

    def save_in_progress() -> None:
        with archive._lock:  # as another session's save holds it while it commits
            holding.set()
            release.wait(30)

    saver = threading.Thread(target=save_in_progress)
    saver.start()
    holding.wait(30)
    answers: list[object] = []
    reader = threading.Thread(target=lambda: answers.append(archive.notes_at("s", None)))
    reader.start()
    reader.join(30)
    still_waiting = reader.is_alive()
    release.set()
    saver.join()
    reader.join()
    archive.close()
    assert not still_waiting and answers == [None]


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
