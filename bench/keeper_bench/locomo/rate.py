"""How fast the embedding backend indexes real messages, and what each part of it costs.

Each conversation's turns go into an in-memory ``EmbeddingRetriever`` one message per ``add``
(as the keeper archives a chat), with the passages and context the recall benchmark uses
(``messages``); the rate counts from the first ``add`` to the end of ``flush`` (the background
worker embedding and writing), with the model already loaded (its load is timed apart, once per
process). The embedder is wrapped to time its own calls, so the table splits the CPU between the
model and the rest (chromadb's writes, tokenising, the queue), and counts the vectors a message
costs (one, plus one per sentence of a message of several, with sentence vectors).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from keeper_bench.locomo.dataset import Conversation
from keeper_bench.locomo.indexing import conversation_passages
from keeper_middleware.retrievers.embedders import EMBEDDERS, Embedder, embedder_name

SESSION = "locomo-rate"


class TimedEmbedder:
    """Passes calls on to an embedder and adds up the texts, wall and CPU time they took.

    CPU time is the whole process's (the model's threads included), so it is only clean when
    nothing else in the process runs at the same time: here the caller only waits for the
    worker."""

    def __init__(self, embedder: Embedder) -> None:
        self._embedder = embedder
        self.name = embedder_name(embedder)
        self.texts = 0
        self.wall = 0.0
        self.cpu = 0.0

    def __call__(self, texts: list[str]) -> list[list[float]]:
        wall, cpu = time.perf_counter(), time.process_time()
        vectors = self._embedder(texts)
        self.wall += time.perf_counter() - wall
        self.cpu += time.process_time() - cpu
        self.texts += len(texts)
        return vectors


@dataclass(frozen=True, slots=True, kw_only=True)
class RateRow:
    embedder: str
    sentence_vectors: bool
    sentence_words: int | None
    messages: int
    vectors: int
    wall_s: float
    cpu_s: float
    embed_cpu_s: float
    load_s: float

    @property
    def per_second(self) -> float:
        return self.messages / self.wall_s if self.wall_s else 0.0

    @property
    def per_cpu_second(self) -> float:
        return self.messages / self.cpu_s if self.cpu_s else 0.0


def measure_rate(
    embedder_key: str,
    conversations: Sequence[Conversation],
    *,
    sentence_vectors: bool,
    sentence_words: int | None = None,
    threads: int | None = None,
    loaded: dict[str, tuple[Embedder, float]] | None = None,
) -> RateRow:
    """Indexes every conversation's turns with one embedder (loaded once; its load time is
    ``load_s``) and times it."""
    from keeper_middleware.retrievers.embedding import SENTENCE_WORDS, EmbeddingRetriever

    cache = loaded if loaded is not None else {}
    if embedder_key not in cache:
        started = time.perf_counter()
        made = _make(embedder_key, threads)
        made(["The model loads before the clock starts."])
        cache[embedder_key] = (made, time.perf_counter() - started)
    model, load_s = cache[embedder_key]
    timed = TimedEmbedder(model)
    messages = 0
    wall = cpu = 0.0
    for conversation in conversations:
        passages = conversation_passages(conversation, session=SESSION, granularity="messages")
        by_turn: dict[str, list[Any]] = {}
        for passage in passages.passages:
            by_turn.setdefault(passages.turn_of[passage.position], []).append(passage)
        retriever = EmbeddingRetriever(
            embedder=timed,
            sentence_vectors=sentence_vectors,
            sentence_words=sentence_words or SENTENCE_WORDS,
        )
        try:
            started, started_cpu = time.perf_counter(), time.process_time()
            for batch in by_turn.values():
                retriever.add(batch)
            retriever.flush()
            wall += time.perf_counter() - started
            cpu += time.process_time() - started_cpu
        finally:
            retriever.close()
        messages += passages.turns
    return RateRow(
        embedder=embedder_key,
        sentence_vectors=sentence_vectors,
        sentence_words=sentence_words if sentence_vectors else None,
        messages=messages,
        vectors=timed.texts,
        wall_s=wall,
        cpu_s=cpu,
        embed_cpu_s=timed.cpu,
        load_s=load_s,
    )


def _make(key: str, threads: int | None) -> Embedder:
    if key not in EMBEDDERS:
        raise ValueError(f"Unknown embedder {key!r}: use one of {', '.join(EMBEDDERS)}.")
    if threads is None:
        return EMBEDDERS[key]()
    from keeper_middleware.retrievers.embedders import MiniLMEmbedder, OnnxMiniLMEmbedder

    if key == "minilm":
        return MiniLMEmbedder(threads=threads)
    if key in ("minilm-int8", "minilm-q8"):
        return OnnxMiniLMEmbedder(threads=threads, quantized=key == "minilm-q8")
    raise ValueError(f"--threads applies to minilm, minilm-int8 and minilm-q8, not {key!r}.")


def _sentence_vectors(row: RateRow) -> str:
    if not row.sentence_vectors:
        return "no"
    if row.sentence_words is None:
        return "yes"
    return f"yes, {row.sentence_words}+ words"


def render_rates(rows: Sequence[RateRow], *, note: str) -> str:
    lines = [
        "| embedder | sentence vectors | messages | vectors (per message) | messages/s (wall) "
        "| messages per CPU-s | CPU ms per vector: model / the rest | model load (s) |",
        "|---|---|---:|---:|---:|---:|---|---:|",
    ]
    for row in rows:
        model_ms = 1000 * row.embed_cpu_s / row.vectors if row.vectors else 0.0
        rest_ms = 1000 * (row.cpu_s - row.embed_cpu_s) / row.vectors if row.vectors else 0.0
        lines.append(
            f"| {row.embedder} | {_sentence_vectors(row)} | {row.messages} "
            f"| {row.vectors} ({row.vectors / max(row.messages, 1):.2f}) "
            f"| {row.per_second:.0f} | {row.per_cpu_second:.0f} "
            f"| {model_ms:.2f} / {rest_ms:.2f} | {row.load_s:.1f} |"
        )
    loads = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{note}\n\n" + "\n".join(lines) + f"\n\nLoad average after (1, 5, 15 min): {loads}.\n"
