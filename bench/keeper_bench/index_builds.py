"""The large archives ``keeper-bench index-cost`` measures: written once, indexed apart.

The archive's file is written alone (``write_archive``) and each keyword engine's index is built
on it from its turns, so an engine's build time and size are its own, and a 10M-message
archive written once serves every engine measured on it.
"""

from __future__ import annotations

import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from keeper_bench.chat_lines import chat_message
from keeper_middleware.archive.records import ArchivedTurn
from keeper_middleware.archive.store import open_archive, put_values
from keeper_middleware.retrievers.base import Passage

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
