"""Recall per conversation: the spread a lever must survive before it is worth shipping.

One conversation's 150–200 questions give a standard error of about 0.04, and the conversations
differ from each other by more than that, so a setting is chosen only when it wins on each
conversation (or on both halves of each), not on a pooled mean that one easy conversation can
carry. :func:`measure_spread` measures a method conversation by conversation (one indexing and
one search each, the halves from the same run) and :func:`render_spread` prints, per method, each
conversation's any@5 and all@5, their mean, min and max, each half's any@5, and, against the
first method listed, how many conversations and halves it wins, ties and loses.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from keeper_bench.locomo.dataset import Conversation
from keeper_bench.locomo.recall import HALVES, MethodResult, measure_halves
from keeper_middleware.retrievers.embedders import Embedder

K = TypeVar("K")


@dataclass(frozen=True, slots=True)
class Spread:
    """One method's figures: pooled over every conversation, and per conversation."""

    method: str
    pooled: list[MethodResult]
    """One result (or one per half) over all the conversations' questions."""
    by_conversation: dict[str, list[MethodResult]]
    """Per sample id, one result (or one per half)."""

    def any5(self) -> dict[str, float]:
        """Each conversation's any@5 over both halves."""
        return {c: _joined(r).rate(5) for c, r in self.by_conversation.items()}

    def all5(self) -> dict[str, float]:
        return {c: _joined(r).rate(5, every=True) for c, r in self.by_conversation.items()}

    def half_any5(self) -> dict[tuple[str, str], float]:
        """any@5 per (conversation, half); empty when the halves were not asked for."""
        return {
            (c, half): result.rate(5)
            for c, results in self.by_conversation.items()
            if len(results) == len(HALVES)
            for half, result in zip(HALVES, results, strict=True)
        }


def measure_spread(
    spec_text: str,
    conversations: Sequence[Conversation],
    embedders: dict[str, Embedder],
    *,
    halves: bool,
) -> Spread:
    """One method on each conversation apart, and pooled.

    Args:
        spec_text: The method (``BACKEND[:OPTION...]``, ``keeper_bench.locomo.recall``).
        conversations: The conversations, each indexed on its own.
        embedders: Embedders shared across methods (their vectors are reused).
        halves: Also split each conversation's questions into even and odd halves.

    Raises:
        ValueError: Two conversations share a sample id (their figures would mix).
    """
    ids = [c.sample_id for c in conversations]
    if len(set(ids)) != len(ids):
        raise ValueError(
            f"Conversations must have distinct sample ids to be told apart, got {ids}."
        )
    by_conversation = {
        c.sample_id: measure_halves(spec_text, [c], embedders, halves=halves) for c in conversations
    }
    parts = list(by_conversation.values())
    pooled = [merge([p[i] for p in parts], method=parts[0][i].method) for i in range(len(parts[0]))]
    return Spread(spec_text, pooled, by_conversation)


def merge(results: Sequence[MethodResult], *, method: str) -> MethodResult:
    """Results of one method on several question sets as one (counts and timings added)."""
    merged = MethodResult(method=method)
    for result in results:
        merged.questions += result.questions
        for k, n in result.found_any.items():
            merged.found_any[k] = merged.found_any.get(k, 0) + n
        for k, n in result.found_all.items():
            merged.found_all[k] = merged.found_all.get(k, 0) + n
        for label, found in result.any5_by_category.items():
            merged.any5_by_category.setdefault(label, []).extend(found)
        merged.turns += result.turns
        merged.index_wall += result.index_wall
        merged.index_cpu += result.index_cpu
        merged.latencies_ms += result.latencies_ms
        merged.cpu_ms += result.cpu_ms
        merged.index_cached = merged.index_cached or result.index_cached
    return merged


def _joined(results: list[MethodResult]) -> MethodResult:
    return merge(results, method=results[0].method.partition(" [")[0])


def render_spread(spreads: Sequence[Spread]) -> str:
    """The per-conversation table; the first method is the one the others are compared with."""
    if not spreads:
        return ""
    conversations = list(spreads[0].by_conversation)
    header = (
        "| method | "
        + " | ".join(f"{c} any@5 / all@5" for c in conversations)
        + " | mean any@5 | min any@5 | max any@5 | mean all@5 "
        + "| halves any@5 (even/odd per conversation) | vs first: conversations +/=/- "
        + "| vs first: halves +/=/- |"
    )
    lines = [header, "|---|" + "---:|" * (len(conversations) + 4) + "---|---:|---:|"]
    first = spreads[0]
    for spread in spreads:
        any5, all5, halves = spread.any5(), spread.all5(), spread.half_any5()
        cells = [f"{any5[c]:.2f} / {all5[c]:.2f}" for c in conversations]
        half_cells = " ".join(
            f"{halves[(c, 'even')]:.2f}/{halves[(c, 'odd')]:.2f}"
            for c in conversations
            if (c, "even") in halves
        )
        lines.append(
            f"| {spread.method} | "
            + " | ".join(cells)
            + f" | {statistics.fmean(any5.values()):.3f} | {min(any5.values()):.2f} "
            f"| {max(any5.values()):.2f} | {statistics.fmean(all5.values()):.3f} "
            f"| {half_cells or '-'} | {_tally(any5, first.any5())} "
            f"| {_tally(halves, first.half_any5()) if halves else '-'} |"
        )
    return "\n".join(lines) + "\n"


def _tally(figures: Mapping[K, float], against: Mapping[K, float]) -> str:
    """Wins, ties and losses against the same keys of another method (to 1e-9)."""
    wins = sum(1 for key, value in figures.items() if value > against.get(key, value) + 1e-9)
    losses = sum(1 for key, value in figures.items() if value < against.get(key, value) - 1e-9)
    return f"{wins}/{len(figures) - wins - losses}/{losses}"
