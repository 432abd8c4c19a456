"""Retrieval recall on LoCoMo: does a search for the question find the turns that answer it?

For each question of categories 1–4 with annotated evidence, the question is the query; it is
found at k when the turns of its evidence are among the turns of the top-k hits (``any``: one of
them is; ``all``: every one is). No model is involved. Every method indexes the same turns
(sessions as items), and the table also gives the indexing rate (turns a second, CPU seconds) and
search latency (wall and CPU, ms).

A method is written ``BACKEND[:OPTION...]``: BACKEND is ``keyword``, ``embedding``, ``hybrid``
(ours) or a baseline, ``bm25s`` (bm25s over whole turns) or ``cosine`` (exact cosine over whole
turns, MiniLM unless an embedder is named). Options: a granularity (``messages``,
``sentences+context``, ``sentences``), an embedder (``minilm``, ``minilm-int8``, ``e5-small``,
``hashing``, ``mpnet``: all-mpnet-base-v2 from the folder ``$KEEPER_BENCH_MPNET``), ``w=X``
(hybrid: the keyword list's weight in rank fusion), ``k=N`` (hybrid: the fusion constant), ``d=N`` (hybrid: each backend is asked for N times the hits), ``nostem``, ``oldstop`` and
``nonames`` (keyword: no Porter stemming; the first, shorter stop-word list; no matching of the
question's names and dates to the passages' context, ``retrievers/named_context.py``),
``tantivy`` (keyword and the hybrid's keyword side: the tantivy engine instead of FTS5),
``nodates`` / ``dates`` (embedding: no matching of the question's months and years / matching
them in the hybrid's embedding side too), ``onevector`` (embedding: one
vector per passage, not also one per sentence of a message), ``sw=N`` (embedding: a sentence
vector covers consecutive sentences of at least N words; 1: one per sentence), ``skip=N``
(embedding: a sentence of fewer than N words has no vector of its own), ``qwho`` / ``who``
(the speaker context), ``when`` (the date context: ``bench/keeper_bench/locomo/speakers.py``), ``baresentences``
(embedding: sentence vectors without the passage's context), ``prf`` or ``prf=D/T`` (keyword and
the hybrid's keyword side: pseudo-relevance feedback, T words of the top D hits added and the
expanded ranking fused with the original; 5/5 by default), ``prfonly`` / ``prfonly=D/T`` (the
expanded ranking alone), ``noreplies`` / ``replies=W/L/N`` (hybrid: no reply window / a passage
also scores L × the fused scores of the W passages before it, the first N fused hits keeping
their places; ``retrievers/reply_window.py``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from keeper_bench.locomo.dataset import Conversation, Question
from keeper_bench.locomo.indexing import (
    conversation_passages,
    whole_turns,
)
from keeper_bench.locomo.methods import (
    BENCH_EMBEDDERS,
    DEFAULT_METHODS,
    CachedEmbedder,
    MethodSpec,
    build_retriever,
    configuration,
    shared_embedder,
)
from keeper_middleware.retrievers.embedders import (
    Embedder,
    embed_query,
)

__all__ = [
    "BENCH_EMBEDDERS",
    "DEFAULT_METHODS",
    "HALVES",
    "KS",
    "SESSION",
    "CachedEmbedder",
    "MethodResult",
    "MethodSpec",
    "build_retriever",
    "configuration",
    "measure",
    "measure_halves",
    "render",
    "scored_questions",
    "shared_embedder",
]

KS = (1, 5, 10)
SESSION = "locomo"


@dataclass(slots=True)
class MethodResult:
    method: str
    questions: int = 0
    found_any: dict[int, int] = field(default_factory=dict)
    found_all: dict[int, int] = field(default_factory=dict)
    any5_by_category: dict[str, list[int]] = field(default_factory=dict)
    turns: int = 0
    index_wall: float = 0.0
    index_cpu: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    index_cached: bool = False
    """Some vectors came from an earlier method's embedding: no indexing rate of its own."""

    def rate(self, k: int, *, every: bool = False) -> float:
        found = self.found_all if every else self.found_any
        return found.get(k, 0) / self.questions if self.questions else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "questions": self.questions,
            **{f"any@{k}": round(self.rate(k), 4) for k in KS},
            **{f"all@{k}": round(self.rate(k, every=True), 4) for k in KS},
            "any@5_by_category": {
                str(c): round(sum(v) / len(v), 4) for c, v in sorted(self.any5_by_category.items())
            },
            "turns": self.turns,
            "index_turns_per_s": (
                round(self.turns / self.index_wall, 1)
                if self.index_wall and not self.index_cached
                else None
            ),
            "index_cpu_s": None if self.index_cached else round(self.index_cpu, 2),
            "search_p50_ms": round(_quantile(self.latencies_ms, 50), 2),
            "search_p95_ms": round(_quantile(self.latencies_ms, 95), 2),
            "search_cpu_p95_ms": round(_quantile(self.cpu_ms, 95), 2),
        }


Search = Callable[[str, int, int | None], list[str]]
"""A query, k and the last item it may see (None: all) in, the ``dia_id`` of each of the top-k
hits out (in rank order)."""


def scored_questions(conversation: Conversation) -> list[Question]:
    """The questions retrieval is measured on: categories 1–4 with evidence in the conversation."""
    return [q for q in conversation.questions if q.category != 5 and q.evidence]


HALVES = ("even", "odd")
"""The question halves ``--halves`` reports apart: choose on one, check on the other."""


def measure(
    spec_text: str,
    conversations: Sequence[Conversation],
    embedders: dict[str, Embedder],
) -> MethodResult:
    return measure_halves(spec_text, conversations, embedders, halves=False)[0]


def measure_halves(
    spec_text: str,
    conversations: Sequence[Conversation],
    embedders: dict[str, Embedder],
    *,
    halves: bool = True,
) -> list[MethodResult]:
    """One method's recall; ``halves``: two results, the questions of even and of odd index
    (counted per conversation, among the scored ones) apart, from one indexing and one search
    each, so a setting chosen on the even half is checked on questions it was not chosen on."""
    spec = MethodSpec.parse(spec_text)
    results = (
        [MethodResult(method=f"{spec_text} [{half}]") for half in HALVES]
        if halves
        else [MethodResult(method=spec_text)]
    )
    for embedder in embedders.values():
        if isinstance(embedder, CachedEmbedder):
            embedder.method = spec_text
    for conversation in conversations:
        hits_before = _cache_hits(embedders)
        wall, cpu = time.perf_counter(), time.process_time()
        search, close, turns = _build(spec, conversation, embedders)
        cached = _cache_hits(embedders) > hits_before
        index_wall, index_cpu = time.perf_counter() - wall, time.process_time() - cpu
        for result in results:
            result.index_cached = result.index_cached or cached
            result.index_wall += index_wall
            result.index_cpu += index_cpu
            result.turns += turns
        try:
            for index, question in enumerate(scored_questions(conversation)):
                result = results[index % len(results)]
                wall, cpu = time.perf_counter(), time.process_time()
                ranked = search(question.question, max(KS), question.asked_after)
                result.latencies_ms.append((time.perf_counter() - wall) * 1000)
                result.cpu_ms.append((time.process_time() - cpu) * 1000)
                _count(result, question, ranked)
        finally:
            close()
    return results


def _cache_hits(embedders: dict[str, Embedder]) -> int:
    return sum(getattr(e, "hits", 0) for e in embedders.values())


def _count(result: MethodResult, question: Question, ranked: list[str]) -> None:
    result.questions += 1
    evidence = set(question.evidence)
    for k in KS:
        top = set(ranked[:k])
        result.found_any[k] = result.found_any.get(k, 0) + bool(evidence & top)
        result.found_all[k] = result.found_all.get(k, 0) + evidence.issubset(top)
    label = question.kind or str(question.category)
    result.any5_by_category.setdefault(label, []).append(int(bool(evidence & set(ranked[:5]))))


def _build(
    spec: MethodSpec, conversation: Conversation, embedders: dict[str, Embedder]
) -> tuple[Search, Callable[[], None], int]:
    if spec.backend == "bm25s":
        return (*_bm25s_baseline(conversation), len(whole_turns(conversation)[0]))
    if spec.backend == "cosine":
        embedder = shared_embedder(spec.embedder, embedders)
        return (*_cosine_baseline(conversation, embedder), len(whole_turns(conversation)[0]))
    indexed = conversation_passages(conversation, session=SESSION, granularity=spec.granularity)
    retriever = build_retriever(spec, embedders)
    by_item: dict[int, list[Any]] = {}
    for passage in indexed.passages:
        by_item.setdefault(passage.item, []).append(passage)
    for batch in by_item.values():
        retriever.add(batch)
    retriever.flush()

    def search(query: str, k: int, to_item: int | None) -> list[str]:
        hits = retriever.search(query, session=SESSION, k=k, to_item=to_item)
        return [indexed.turn_of[h.passage.position] for h in hits]

    return search, retriever.close, indexed.turns


def _bm25s_baseline(conversation: Conversation) -> tuple[Search, Callable[[], None]]:
    import bm25s

    texts, ids = whole_turns(conversation)
    model = bm25s.BM25()
    model.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)

    def search(query: str, k: int, to_item: int | None) -> list[str]:
        tokens = bm25s.tokenize([query], stopwords="en", show_progress=False)
        if isinstance(tokens, list) or not tokens.vocab:  # ids (the default) come as Tokenized
            return []
        found, _ = model.retrieve(tokens, k=len(texts), show_progress=False)
        return [ids[int(i)] for i in found[0] if _seen(ids[int(i)], to_item)][:k]

    return search, lambda: None


def _cosine_baseline(
    conversation: Conversation, embedder: Embedder
) -> tuple[Search, Callable[[], None]]:
    import numpy as np

    texts, ids = whole_turns(conversation)
    matrix = np.array(embedder(texts), dtype=np.float32)

    def search(query: str, k: int, to_item: int | None) -> list[str]:
        scores = matrix @ np.array(embed_query(embedder, query), dtype=np.float32)
        return [ids[int(i)] for i in np.argsort(-scores) if _seen(ids[int(i)], to_item)][:k]

    return search, lambda: None


def _seen(dia_id: str, to_item: int | None) -> bool:
    """Whether the turn ``D<session>:<n>`` was in the conversation by session ``to_item``."""
    return to_item is None or int(dia_id[1:].partition(":")[0]) <= to_item


def _quantile(values: list[float], q: int) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100)[q - 1]


def _by_category(rates: dict[str, float]) -> str:
    """LoCoMo's four categories as ``a/b/c/d``; other labels (the streams' kinds) by name."""
    if set(rates) <= {"1", "2", "3", "4"}:
        return "/".join(f"{rates.get(str(c), float('nan')):.2f}" for c in (1, 2, 3, 4))
    return " ".join(f"{label} {rate:.2f}" for label, rate in rates.items())


def render(
    results: Sequence[MethodResult],
    *,
    title: str,
    note: str = "",
    configurations: bool = False,
) -> str:
    lines = [
        f"# {title}",
        "",
        *([note, ""] if note else []),
        "| method | questions | any@1 | any@5 | all@5 | any@10 | any@5 by category (1/2/3/4 or kind) "
        "| index (turns/s) | index CPU (s) | search p50 (ms) | search p95 (ms) | search CPU p95 (ms) |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for result in results:
        row = result.to_json()
        by_category = _by_category(row["any@5_by_category"])
        rate, cpu = row["index_turns_per_s"], row["index_cpu_s"]
        lines.append(
            f"| {row['method']} | {row['questions']} | {row['any@1']:.2f} | {row['any@5']:.2f} "
            f"| {row['all@5']:.2f} | {row['any@10']:.2f} | {by_category} "
            f"| {rate if rate is not None else 'reused'} "
            f"| {'reused' if cpu is None else f'{cpu:.1f}'} "
            f"| {row['search_p50_ms']:.1f} | {row['search_p95_ms']:.1f} "
            f"| {row['search_cpu_p95_ms']:.1f} |"
        )
    if configurations:
        lines += ["", "Configurations:", ""]
        methods = dict.fromkeys(r.method.partition(" [")[0] for r in results)
        lines += [f"- `{m}`: {configuration(MethodSpec.parse(m))}" for m in methods]
    return "\n".join(lines) + "\n"
