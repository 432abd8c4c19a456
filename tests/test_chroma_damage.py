"""A chroma folder a stopped process left damaged is rebuilt from the archive, never opened.

A process stopped in the middle of a chroma write can leave an HNSW segment that chromadb's
native code crashes on (a segmentation fault on every ``count``, ``get`` or ``query``), so the
keeper crashed on every start. Now the folder is checked before chromadb opens it: a write
marker left standing, or segment files that do not match their header, set it aside, and the
archive's catch-up builds the index again. A healthy folder is opened as it is
(``test_index_rebuild.py``).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from keeper_middleware.retrievers import chroma_folder
from keeper_middleware.retrievers.base import Passage, stored_count
from keeper_middleware.retrievers.chroma_folder import MARKER, damage, writing
from keeper_middleware.retrievers.embedders import HashingEmbedder
from keeper_middleware.retrievers.embedding import EmbeddingRetriever
from tests.test_index_rebuild import (
    SESSION,
    TURNS,
    archive_turns,
    forget_open_chroma_clients,
    open_keeper,
)

PERSISTED = 1_100
"""Vectors enough for chroma to persist its HNSW segment (it syncs every 1,000)."""


def test_a_write_cut_short_leaves_its_marker_and_the_next_search_rebuilds_the_index(
    tmp_path, caplog
):
    archive = tmp_path / "agent.sqlite3"
    keeper = open_keeper(archive, "hybrid", "fts5")
    archive_turns(keeper)
    assert "recorded zephyr7 at 49" in keeper.search(SESSION, "zephyr7")
    keeper.close()
    forget_open_chroma_clients()  # as a restart would
    chroma = archive.with_suffix(".index") / "chroma"
    (chroma / MARKER).touch()  # what a process stopped inside a chroma write leaves

    with caplog.at_level("WARNING"):
        reopened = open_keeper(archive, "hybrid", "fts5")
        assert "recorded zephyr7 at 49" in reopened.search(
            SESSION, "what did the clerk record as zephyr7"
        )
        assert stored_count(reopened.retriever, SESSION) == TURNS  # all of them, once each
        reopened.close()
    assert "index set aside" in caplog.text and "write to it was cut short" in caplog.text
    assert "index rebuilt" in caplog.text
    assert (chroma.parent / "chroma.damaged" / MARKER).exists()  # kept for a look, not used
    assert not (chroma / MARKER).exists()  # the rebuilt folder's writes all returned


def test_a_marker_of_a_writer_still_running_is_not_taken_for_a_cut_write(tmp_path):
    (tmp_path / MARKER).write_text(str(os.getppid()))  # a running process, not this one
    assert damage(tmp_path) is None
    (tmp_path / MARKER).write_text("2147483646")  # no such process: it was stopped
    assert "write to it was cut short" in str(damage(tmp_path))


def test_a_write_that_raises_keeps_its_marker_for_the_next_process(tmp_path):
    with writing(tmp_path):
        assert (tmp_path / MARKER).exists()
    assert not (tmp_path / MARKER).exists()
    with pytest.raises(OSError), writing(tmp_path):
        raise OSError("the disk is full")
    assert (tmp_path / MARKER).exists()
    chroma_folder.forget_opened()


def outgrown_links(segment: Path) -> None:
    """The damage measured on a stopped 1M build: link_lists.bin claiming terabytes (sparse)."""
    os.truncate(segment / "link_lists.bin", 2_660_294_941_776)


def emptied_pickle(segment: Path) -> None:
    """The damage a SIGKILL in a 200K build left: the segment's pickle truncated to rewrite."""
    os.truncate(segment / "index_metadata.pickle", 0)


@pytest.mark.parametrize(
    ("damaged", "reason"),
    [
        (outgrown_links, "link_lists.bin claims 2660294941776 bytes"),
        (emptied_pickle, "index_metadata.pickle is empty"),
    ],
)
def test_a_segment_whose_files_do_not_match_is_set_aside_without_opening_it(
    tmp_path, damaged, reason
):
    folder = tmp_path / "chroma"
    passages = [
        Passage(session=SESSION, item=n, position=n, text=f"Passage {n} names zephyr{n}.")
        for n in range(PERSISTED)
    ]
    built = EmbeddingRetriever(folder, embedder=HashingEmbedder(), sentence_vectors=False)
    built.add(passages)
    built.close()
    forget_open_chroma_clients()  # as a restart would
    (segment,) = [header.parent for header in folder.glob("*/header.bin")]
    header = (segment / "header.bin").read_bytes()
    (elements,) = struct.unpack_from("<Q", header, 20)  # hnswlib's cur_element_count
    assert elements > 0 and damage(folder) is None  # a persisted segment, found healthy
    damaged(segment)

    assert reason in str(damage(folder))
    reopened = EmbeddingRetriever(folder, embedder=HashingEmbedder(), sentence_vectors=False)
    assert reopened.count(SESSION) == 0  # an empty index for the archive to fill, no crash
    reopened.close()
    assert Path(f"{folder}.damaged", segment.name, "header.bin").exists()  # moved, not opened
    forget_open_chroma_clients()  # as a restart would
