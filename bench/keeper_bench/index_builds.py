"""The large archives ``keeper-bench index-cost`` measures: written once, indexed apart.

The archive's file is written alone (``write_archive``) and each keyword engine's index is built
on it from its turns, so an engine's build time and size are its own, and a 10M-message
archive written once serves every engine measured on it. ``build_archive`` makes the archive
the steps and searches run on, once a folder: written, then indexed by keyword and by vectors
the bulk embedder makes (:class:`BulkEmbedder`), ``BULK_SLICE`` turns at a time.
"""

from __future__ import annotations

import os
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from keeper_bench.chat_lines import chat_message
from keeper_middleware.archive.records import ArchivedTurn
from keeper_middleware.archive.store import open_archive, put_values
from keeper_middleware.retrievers.base import Passage
from keeper_middleware.search.indexing import catch_up

SESSION = "big"


def write_archive(
    path: Path, messages: int, vocabulary: str, *, say: Callable[[str], None]
) -> None:
    """The archive's file alone, ``messages`` chat messages archived in cuts of 2,000."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in (path, path.with_suffix(".index")):
        if stale.is_dir():
            shutil.rmtree(stale)
        elif stale.exists():
            stale.unlink()
    archive = open_archive(path)
    rng = random.Random(7)
    started = time.perf_counter()
    per_cut = 2_000
    for start in range(0, messages, per_cut):
        turns = [
            ArchivedTurn(
                session=SESSION,
                msg_id=f"b{n}",
                item=n // 20 + 1,
                role="human",
                content=chat_message(rng, n, vocabulary=vocabulary),
            )
            for n in range(start, min(messages, start + per_cut))
        ]
        archive.commit_cut(SESSION, cut_key=f"bulk-{start}", turns=turns, notes=None)
    archive.close()
    say(f"archive of {messages:,} messages written in {time.perf_counter() - started:.0f} s")


def build_tantivy(path: Path, *, say: Callable[[str], None], batch: int = 2_000) -> Path:
    """The archive's tantivy keyword index, built once beside its FTS5 one from the archive's
    turns, ``batch`` passages a commit (2,000: the batches a catch-up hands over); says the
    time and both indexes' size. The archive is told what was indexed, as a catch-up tells it
    (each record's first position, then the progress once written): a keeper opened on it
    searches at once rather than indexing the whole archive again."""
    from keeper_middleware.retrievers.factory import KEYWORD_FILE, TANTIVY_FOLDER
    from keeper_middleware.retrievers.tantivy_keyword import TantivyKeywordRetriever
    from keeper_middleware.search.indexing import INDEXED_SEQ, NEXT_POSITION, turn_passages

    index = path.with_suffix(".index")
    folder, done = index / TANTIVY_FOLDER, path.parent / "built-tantivy"
    if done.exists():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    archive, retriever = open_archive(path), TantivyKeywordRetriever(folder)
    started, cpu = time.perf_counter(), time.process_time()
    passages_batch: list[Passage] = []
    positions: list[tuple[int, int]] = []
    position, seen = 0, -1
    for turn in archive.turns(SESSION, after_seq=-1):
        positions.append((turn.seq, position))
        passages = turn_passages(turn, "messages", position)
        position += len(passages)
        passages_batch.extend(passages)
        seen = turn.seq
        if len(passages_batch) >= batch:
            retriever.add(passages_batch)
            archive.set_positions(SESSION, positions)
            passages_batch, positions = [], []
    retriever.add(passages_batch)
    archive.set_positions(SESSION, positions)
    retriever.close()
    put_values(archive, SESSION, {INDEXED_SEQ: seen, NEXT_POSITION: position})
    archive.close()
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    done.write_text("ok")
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    fts5 = sum(f.stat().st_size for f in index.glob(f"{KEYWORD_FILE}*"))
    say(
        f"tantivy index of {position:,} passages built in {wall:.0f} s ({cpu:.0f} s CPU; "
        f"{batch:,} a commit), "
        f"{size / 2**20:,.0f} MB (FTS5 file: {fts5 / 2**20:,.0f} MB)"
    )
    return folder


class BulkEmbedder:
    """The bulk's vectors under the real embedder's name, for building a large index fast (see
    the module docstring): hashing vectors (``bulk="hashing"``), or another model's
    (``"minilm-q8"``: MiniLM's int8 graph, within about 0.99 cosine of MiniLM's vectors); a
    keeper opened on the folder then embeds every query with the real model."""

    def __init__(self, name: str, bulk: str = "hashing") -> None:
        from keeper_middleware.retrievers.embedders import HashingEmbedder, embedder_from_name

        self.name = name
        self.bulk = bulk
        self._embedder = HashingEmbedder(dim=384) if bulk == "hashing" else embedder_from_name(bulk)

    def __call__(self, texts: list[str]) -> list[list[float]]:
        return self._embedder(texts)


BULK_EMBEDDERS = ("hashing", "minilm-q8", "minilm")
"""What ``--bulk`` may make the large archive's vectors with (``minilm``: the model itself)."""
BULK_SLICE = 20_000
"""Turns indexed (and their progress saved) at a time when the bulk's vectors are built."""
BULK_EMBED_BATCH = 256
"""Texts a call to the embedder embeds while the bulk is built (nothing searches meanwhile)."""


def build_archive(
    folder: Path,
    messages: int,
    *,
    say: Callable[[str], None],
    embedder_name: str,
    vectors: bool = True,
    vocabulary: str = "chat",
    keyword: bool = True,
    bulk: str = "hashing",
) -> Path:
    """An archive of one session of ``messages`` one-sentence chat messages, indexed by keyword
    (FTS5, when ``keyword``) and (when ``vectors``) by vectors that ``bulk`` makes; made once in
    ``folder`` (one folder a vocabulary). The archive written is marked apart from its indexes,
    and the index is built ``BULK_SLICE`` turns at a time, each slice's progress saved in the
    archive, so a build stopped half-way goes on from its last slice."""
    from keeper_middleware.retrievers.embedding import EmbeddingRetriever
    from keeper_middleware.retrievers.hybrid import HybridRetriever
    from keeper_middleware.retrievers.keyword import KeywordRetriever

    path = folder / "archive.sqlite3"
    suffix = "" if vocabulary == "chat" else f"-{vocabulary}"
    made_by = "" if bulk == "hashing" else f"-{bulk}"
    marks = [
        f"built-{messages}-{embedder_name}{made_by}{suffix}",
        f"built-{messages}-keyword{suffix}",
    ]
    written = folder / f"written-{messages}{suffix}"
    done = folder / marks[0 if vectors else 1]
    if done.exists() or (folder / marks[0]).exists():
        return path
    if not (keyword or vectors) and (written.exists() or (folder / marks[1]).exists()):
        return path
    if any(folder.glob("built-[0-9]*")):
        raise SystemExit(f"{folder} holds an archive of another size or vocabulary: use another")
    if not written.exists():
        write_archive(path, messages, vocabulary, say=say)
        written.write_text("ok")
    if not (keyword or vectors):
        return path
    started, cpu = time.perf_counter(), time.process_time()
    index = path.with_suffix(".index")
    sides: list[Any] = [KeywordRetriever(index / "keyword.sqlite3")] if keyword else []
    if vectors:
        sides.append(
            EmbeddingRetriever(
                index / "chroma",
                embedder=BulkEmbedder(embedder_name, bulk),
                batch_size=BULK_EMBED_BATCH,
                vector_text="whole",  # the hybrid's embedding side (retrievers/factory.py)
            )
        )
    retriever: Any = HybridRetriever(*sides) if len(sides) == 2 else sides[0]
    from keeper_middleware.archive.store import open_archive

    archive = open_archive(path)
    done_turns = 0
    while added := catch_up(archive, SESSION, (retriever,), most=BULK_SLICE):
        done_turns += added
        say(
            f"  indexed {done_turns:,} passages this run: {time.perf_counter() - started:.0f} s, "
            f"{time.process_time() - cpu:.0f} s CPU (load {load()})"
        )
    retriever.close()
    archive.close()
    what = " and ".join(
        (["keyword"] if keyword else []) + ([f"vectors made by {bulk}"] if vectors else [])
    )
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    say(f"indexed ({what}) in {wall:.0f} s ({cpu:.0f} s CPU)")
    done.write_text("ok")
    return path


def load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())
