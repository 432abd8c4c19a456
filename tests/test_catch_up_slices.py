"""A catch-up in slices: a build of millions of turns saves its progress every slice, so it can
be watched and a crash loses one slice, and the index it leaves is the one a single catch-up
builds."""

from __future__ import annotations

from pathlib import Path

import pytest

from keeper_middleware.archive.records import ArchivedTurn
from keeper_middleware.archive.store import ArchiveStore, open_archive
from keeper_middleware.errors import ConfigurationError
from keeper_middleware.retrievers.keyword import KeywordRetriever
from keeper_middleware.search.indexing import INDEXED_SEQ, NEXT_POSITION, catch_up

WORDS = ("garden", "violin", "canoe", "museum", "pottery", "sunset", "chess")


def archive_of(path: Path, turns: int) -> ArchiveStore:
    archive = open_archive(path)
    archive.commit_cut(
        "s",
        cut_key="cut-1",
        turns=[
            ArchivedTurn(
                session="s",
                msg_id=f"m{n}",
                item=n + 1,
                role="human",
                content=f"Turn {n}: we talked about the {WORDS[n % len(WORDS)]}.",
            )
            for n in range(turns)
        ],
        notes=None,
    )
    return archive


def test_each_slice_indexes_at_most_its_turns_and_saves_its_progress(tmp_path):
    archive = archive_of(tmp_path / "a.sqlite3", 10)
    index = KeywordRetriever(":memory:")
    added, marks = [], []
    while passages := catch_up(archive, "s", (index,), most=4):
        added.append(passages)
        marks.append(int(archive.get_value("s", NEXT_POSITION) or 0))
    assert added == [4, 4, 2]
    assert marks == [4, 8, 10]
    last = max(turn.seq for turn in archive.turns("s"))
    assert int(archive.get_value("s", INDEXED_SEQ) or -1) == last
    assert index.count("s") == 10


def test_slices_build_the_index_one_catch_up_builds(tmp_path):
    sliced, whole = KeywordRetriever(":memory:"), KeywordRetriever(":memory:")
    first = archive_of(tmp_path / "a.sqlite3", 9)
    while catch_up(first, "s", (sliced,), most=2):
        pass
    catch_up(archive_of(tmp_path / "b.sqlite3", 9), "s", (whole,))
    for question in ("canoe", "museum trip", "what about chess?"):
        found = [(h.passage.position, h.passage.text) for h in sliced.search(question, session="s")]
        wanted = [(h.passage.position, h.passage.text) for h in whole.search(question, session="s")]
        assert found == wanted and found


def test_a_slice_of_no_turns_is_refused(tmp_path):
    archive = archive_of(tmp_path / "a.sqlite3", 3)
    with pytest.raises(ConfigurationError, match="most must be a positive int"):
        catch_up(archive, "s", (KeywordRetriever(":memory:"),), most=0)
    assert archive.get_value("s", NEXT_POSITION) is None
