"""The archive is the source of truth: delete any index, and the next search builds it again.

Every backend that keeps an index beside the archive (the FTS5 file, the tantivy folder, the
chroma folder of the hybrid's vectors) is deleted while the keeper is down; the keeper opened
next finds the archived turns by its first search, and its index holds every passage again.
Before, an index holding fewer passages than the archive had given it was left as it was, and
a deleted one served nothing of what was archived before.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from keeper_middleware import Keeper, KeeperConfig
from keeper_middleware.archive.records import ArchivedTurn
from keeper_middleware.retrievers import chroma_folder, factory
from keeper_middleware.retrievers.base import stored_count
from keeper_middleware.retrievers.embedders import HashingEmbedder
from keeper_middleware.retrievers.factory import make_retriever
from keeper_middleware.retrievers.keyword import KeywordRetriever
from keeper_middleware.retrievers.tantivy_keyword import TantivyKeywordRetriever

SESSION = "t1"
TURNS = 12


def open_keeper(archive: Path, backend: str, engine: str) -> Keeper:
    config = KeeperConfig(keyword_engine=engine)
    if backend == "keyword":
        return Keeper(config, archive=archive, retriever="keyword")
    hybrid = make_retriever(
        "hybrid",
        path=archive.with_suffix(".index"),
        embedder=HashingEmbedder(),
        vectors_may_lag=True,
        keyword_engine=engine,
    )
    return Keeper(config, archive=archive, retriever=hybrid)


def forget_open_chroma_clients() -> None:
    """Forget the chroma folders this process opened, as a new process would."""
    from chromadb.api.client import SharedSystemClient

    SharedSystemClient.clear_system_cache()
    chroma_folder.forget_opened()


def archive_turns(keeper: Keeper) -> None:
    turns = [
        ArchivedTurn(
            session=SESSION,
            msg_id=f"m{n}",
            item=n + 1,
            role="human",
            content=f"Item {n + 1}. The clerk recorded zephyr{n} at {n * 7}.",
        )
        for n in range(TURNS)
    ]
    keeper.archive.commit_cut(SESSION, cut_key="c1", turns=turns, notes=None)


@pytest.mark.parametrize(
    ("backend", "engine", "index"),
    [
        pytest.param("keyword", "fts5", "keyword.sqlite3", id="fts5-file"),
        pytest.param("keyword", "tantivy", "tantivy", id="tantivy-folder"),
        pytest.param("hybrid", "fts5", "chroma", id="hybrid-chroma-folder"),
        pytest.param("hybrid", "tantivy", "tantivy", id="hybrid-tantivy-folder"),
    ],
)
def test_a_deleted_index_is_built_again_from_the_archive_by_the_next_search(
    tmp_path, backend, engine, index
):
    archive = tmp_path / "agent.sqlite3"
    keeper = open_keeper(archive, backend, engine)
    archive_turns(keeper)
    assert "recorded zephyr7 at 49" in keeper.search(SESSION, "zephyr7")
    keeper.close()
    forget_open_chroma_clients()  # as a restart would: chroma keeps a client a path a process
    deleted = archive.with_suffix(".index") / index
    for path in [deleted, *deleted.parent.glob(f"{index}-*")]:  # an SQLite file's -wal, -shm
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()

    reopened = open_keeper(archive, backend, engine)
    assert "recorded zephyr7 at 49" in reopened.search(
        SESSION, "what did the clerk record as zephyr7"
    )
    assert stored_count(reopened.retriever, SESSION) == TURNS  # every side holds them all again
    reopened.close()


def test_auto_moves_a_grown_fts5_folder_to_tantivy_and_builds_it_from_the_archive(
    tmp_path, monkeypatch
):
    archive = tmp_path / "agent.sqlite3"
    keeper = open_keeper(archive, "keyword", "auto")
    assert isinstance(keeper.retriever, KeywordRetriever)  # a new folder starts on FTS5
    archive_turns(keeper)
    assert "recorded zephyr3 at 21" in keeper.search(SESSION, "zephyr3")
    keeper.close()
    monkeypatch.setattr(factory, "FTS5_LIMIT_BYTES", 0)  # the file has outgrown a small archive

    grown = open_keeper(archive, "keyword", "auto")
    assert isinstance(grown.retriever, TantivyKeywordRetriever)
    assert "recorded zephyr3 at 21" in grown.search(SESSION, "the clerk's zephyr3")
    grown.close()
    monkeypatch.setattr(factory, "FTS5_LIMIT_BYTES", 1 << 40)
    again = open_keeper(archive, "keyword", "auto")  # once moved, it stays on tantivy
    assert isinstance(again.retriever, TantivyKeywordRetriever)
    assert again.retriever.count(SESSION) == TURNS
    again.close()


@pytest.mark.parametrize(
    ("backend", "engine"), [("keyword", "tantivy"), ("hybrid", "fts5")], ids=["tantivy", "hybrid"]
)
def test_an_index_the_archive_never_filled_is_not_rebuilt_on_every_open(
    tmp_path, caplog, backend, engine
):
    archive = tmp_path / "agent.sqlite3"
    keeper = open_keeper(archive, backend, engine)
    archive_turns(keeper)
    keeper.search(SESSION, "zephyr1")
    keeper.close()
    forget_open_chroma_clients()
    with caplog.at_level("WARNING"):
        reopened = open_keeper(archive, backend, engine)
        assert "recorded zephyr1 at 7" in reopened.search(SESSION, "the clerk's zephyr1")
        reopened.close()
    assert "index rebuilt" not in caplog.text
    assert "index set aside" not in caplog.text  # a healthy chroma folder is opened as it is


def test_an_unknown_keyword_engine_lists_the_choices(tmp_path):
    with pytest.raises(ValueError, match="keyword_engine='lucene'; use one of auto, fts5, tantivy"):
        make_retriever("keyword", path=tmp_path, keyword_engine="lucene")
