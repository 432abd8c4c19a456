"""Tables for runs: score by question type and distance, and what each run cost (the plots are
in ``plots.py``).

Every title and header names the reader ("simulated reader" or the model), so a figure copied
out of context still says what produced it.
"""

from __future__ import annotations

from collections.abc import Sequence

from keeper_bench.costs import CostSummary
from keeper_bench.grader import GradeResult
from keeper_bench.questions import BUCKET_LABELS, CATEGORIES


def reader_label(results: Sequence[GradeResult]) -> str:
    """The readers behind a set of results, e.g. "simulated reader" or "qwen3, simulated reader"."""
    readers = list(dict.fromkeys(r.reader for r in results))
    return ", ".join(readers) if readers else "no runs"


def _cell(pair: tuple[int, int] | None) -> str:
    return f"{pair[0]}/{pair[1]}" if pair and pair[1] else "–"


def _row_label(result: GradeResult, index: int) -> str:
    return result.label or f"run {index + 1}"


def score_table(results: Sequence[GradeResult]) -> str:
    """Two markdown tables, one row per run: by question type, then by distance bucket."""
    reader = reader_label(results)
    categories = [c for c in CATEGORIES if any(c in r.by_category for r in results)]
    buckets = [b for b in BUCKET_LABELS if any(b in r.by_bucket for r in results)]
    lines = [f"### Score by question type ({reader})", ""]
    lines.append("| run | " + " | ".join(categories) + " | total |")
    lines.append("| --- |" + " --- |" * (len(categories) + 1))
    for index, result in enumerate(results):
        cells = [_cell(result.by_category.get(c)) for c in categories]
        lines.append(
            f"| {_row_label(result, index)} | "
            + " | ".join([*cells, _cell((result.right, result.asked))])
            + " |"
        )
    lines += ["", f"### Score by distance back, in batches ({reader})", ""]
    lines.append("| run | " + " | ".join(buckets) + " |")
    lines.append("| --- |" + " --- |" * len(buckets))
    for index, result in enumerate(results):
        cells = [_cell(result.by_bucket.get(b)) for b in buckets]
        lines.append(f"| {_row_label(result, index)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def lost_sets_table(results: Sequence[GradeResult]) -> str:
    """Whole question sets lost (a reply that answered nothing) apart from memory errors (wrong
    answers in the sets that were answered): a harness's loss is not a memory's."""
    reader = reader_label(results)
    lines = [
        f"### Whole question sets lost, apart from memory errors ({reader})",
        "",
        "| run | question sets | sets lost whole (their questions) | wrong in answered sets |",
        "| --- | --- | --- | --- |",
    ]
    for index, result in enumerate(results):
        sets, questions = result.lost_sets
        lines.append(
            f"| {_row_label(result, index)} | {result.sets} | {sets} ({questions}) | "
            f"{result.memory_errors} |"
        )
    return "\n".join(lines) + "\n"


def cost_table(rows: Sequence[tuple[str, CostSummary]], *, reader: str) -> str:
    lines = [
        f"### Costs ({reader})",
        "",
        "| run | wall min | model calls (work + mgmt) | prompt tok | completion tok | cached tok | mgmt tok | peak prompt | prefix reuse |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, c in rows:
        lines.append(
            f"| {label} | {c.wall_seconds / 60:.1f} | {c.calls} ({c.work_calls} + {c.management_calls}) | "
            f"{c.prompt_tokens:,} | {c.completion_tokens:,} | "
            f"{f'{c.cached_tokens:,}' if c.cached_reported_calls else '–'} | {c.management_tokens:,} | "
            f"{c.peak_prompt_tokens:,} | {c.prefix_reuse_ratio:.0%} |"
        )
    if any(c.segments for _, c in rows):
        lines += ["", f"### Minutes per 100K tokens of history, by segment ({reader})", ""]
        width = max(len(c.segments) for _, c in rows)
        lines.append(
            "| run | "
            + " | ".join(
                f"{s.start_tokens // 1000}K–{s.end_tokens // 1000}K"
                for s in max((c.segments for _, c in rows), key=len)
            )
            + " |"
        )
        lines.append("| --- |" + " --- |" * width)
        for label, c in rows:
            cells = [f"{s.minutes_per_100k:.2f}" for s in c.segments] + ["–"] * (
                width - len(c.segments)
            )
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
