"""A crash never splits a cut: a failure inside one leaves no part of it, a process killed in
the middle of a cut or at any moment leaves only whole cuts (and replaying them completes the
archive once), and threads or processes writing one store keep seq gap-free and the file sound."""

from __future__ import annotations

import inspect
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading

import pytest

from keeper_middleware.archive.store import ArchiveStore
from tests.archive_stores import (
    audit,
    make_turns,
    notes_for,
    open_store,
    spec_fixture,  # noqa: F401
    store_fixture,  # noqa: F401
)


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
from keeper_middleware.archive.store import ArchiveStore
from keeper_middleware.archive.records import ArchivedTurn, NotesDraft
from keeper_middleware.archive.sqlite import SQLiteArchive
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
