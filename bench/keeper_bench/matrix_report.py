"""The comparison matrix's tables: every arm and peer setting × fault mix × seed, summed fairly.

Pure: each finished run is one :class:`MatrixRun`; the tables add up the seeds of one arm (so a
cell reads "right/asked over every seed"), and show the spread between seeds where it matters
(the totals, as the lowest and highest seed's share). Costs are the mean per seed. The audit
counts every memory an arm keeps (NOTES or summaries) the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from keeper_bench.costs import CostSummary
from keeper_bench.grader import GradeResult
from keeper_bench.questions import BUCKET_LABELS, CATEGORIES

FAULT_LABELS = {"none": "no faults", "realistic": "realistic faults"}


@dataclass(frozen=True, slots=True)
class MatrixRun:
    """One arm on one stream (size, seed) under one fault mix."""

    size: str
    faults: str
    seed: int
    arm: str
    grade: GradeResult
    costs: CostSummary | None
    audit: Mapping[str, Any] | None
    reasks: int | None = None
    """Notes re-asks of the keeper arms (None for the others)."""


def _select(runs: Sequence[MatrixRun], **wanted: Any) -> list[MatrixRun]:
    return [r for r in runs if all(getattr(r, k) == v for k, v in wanted.items())]


def arms_in(runs: Sequence[MatrixRun]) -> list[str]:
    return list(dict.fromkeys(r.arm for r in runs))


def _summed(grades: Sequence[GradeResult], key: str, name: str) -> tuple[int, int]:
    right = asked = 0
    for grade in grades:
        pair = getattr(grade, key).get(name)
        if pair is not None:
            right, asked = right + pair[0], asked + pair[1]
    return right, asked


def _share(right: int, asked: int) -> str:
    return f"{100 * right / asked:.0f}%" if asked else "–"


def total_cell(grades: Sequence[GradeResult]) -> str:
    """ "185/189 (97–100%)": right/asked over every seed, then the lowest and highest seed."""
    right = sum(g.right for g in grades)
    asked = sum(g.asked for g in grades)
    if not asked:
        return "–"
    shares = sorted(g.right / g.asked for g in grades if g.asked)
    low, high = f"{100 * shares[0]:.0f}%", f"{100 * shares[-1]:.0f}%"
    spread = low if low == high else f"{low}–{high}"
    return f"{right}/{asked} ({spread})" if len(grades) > 1 else f"{right}/{asked}"


def _cell(pair: tuple[int, int]) -> str:
    return f"{pair[0]}/{pair[1]}" if pair[1] else "–"


def headline_table(runs: Sequence[MatrixRun], size: str, reader: str) -> str:
    """Every arm's total, with no faults and with the realistic mix side by side."""
    mixes = list(dict.fromkeys(r.faults for r in runs if r.size == size))
    seeds = sorted({r.seed for r in runs if r.size == size})
    lines = [
        f"### {size}: total right, {len(seeds)} seed(s) summed ({reader})",
        "",
        "| arm | " + " | ".join(FAULT_LABELS.get(m, m) for m in mixes) + " |",
        "| --- |" + " --- |" * len(mixes),
    ]
    for arm in arms_in(runs):
        cells = [
            total_cell([r.grade for r in _select(runs, size=size, faults=m, arm=arm)])
            for m in mixes
        ]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    lines += ["", "(lowest–highest seed in brackets)"]
    return "\n".join(lines) + "\n"


def score_tables(runs: Sequence[MatrixRun], size: str, faults: str, reader: str) -> str:
    """By question type and by distance, summed over seeds, one row per arm."""
    chosen = _select(runs, size=size, faults=faults)
    grades = {arm: [r.grade for r in _select(chosen, arm=arm)] for arm in arms_in(chosen)}
    every = [g for group in grades.values() for g in group]
    categories = [c for c in CATEGORIES if any(c in g.by_category for g in every)]
    buckets = [b for b in BUCKET_LABELS if any(b in g.by_bucket for g in every)]
    title = f"{size}, {FAULT_LABELS.get(faults, faults)}"
    lines = [f"#### Score by question type: {title} ({reader})", ""]
    lines.append("| arm | " + " | ".join(categories) + " | total (seed range) |")
    lines.append("| --- |" + " --- |" * (len(categories) + 1))
    for arm, group in grades.items():
        cells = [_cell(_summed(group, "by_category", c)) for c in categories]
        lines.append(f"| {arm} | " + " | ".join([*cells, total_cell(group)]) + " |")
    lines += ["", f"#### Score by distance back, in batches: {title} ({reader})", ""]
    lines.append("| arm | " + " | ".join(buckets) + " |")
    lines.append("| --- |" + " --- |" * len(buckets))
    for arm, group in grades.items():
        cells = [_cell(_summed(group, "by_bucket", b)) for b in buckets]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def cost_table(runs: Sequence[MatrixRun], size: str, faults: str, reader: str) -> str:
    """Mean per seed: model calls, prompt tokens (all, and what a prefix cache could not serve),
    management tokens, the peak request and the run's wall time."""
    chosen = [r for r in _select(runs, size=size, faults=faults) if r.costs is not None]
    lines = [
        f"#### Costs, mean per seed: {size}, {FAULT_LABELS.get(faults, faults)} ({reader})",
        "",
        "| arm | model calls (work + mgmt) | prompt tok | uncached prompt tok ≈ | mgmt tok "
        "| peak request | wall s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for arm in arms_in(chosen):
        costs = [r.costs for r in _select(chosen, arm=arm) if r.costs is not None]
        lines.append(
            f"| {arm} | {_mean([c.calls for c in costs]):,.0f} "
            f"({_mean([c.work_calls for c in costs]):,.0f} + "
            f"{_mean([c.management_calls for c in costs]):,.0f}) | "
            f"{_mean([c.prompt_tokens for c in costs]):,.0f} | "
            f"{_mean([c.prompt_tokens - c.prefix_reuse_tokens for c in costs]):,.0f} | "
            f"{_mean([c.management_tokens for c in costs]):,.0f} | "
            f"{max(c.peak_prompt_tokens for c in costs):,} | "
            f"{_mean([c.wall_seconds for c in costs]):.1f} |"
        )
    lines += [
        "",
        "≈ uncached: prompt tokens not shared with the call before (what a prefix cache could "
        "not serve), estimated from the leading messages each call shared with the one before.",
    ]
    return "\n".join(lines) + "\n"


def audit_table(runs: Sequence[MatrixRun], size: str, reader: str) -> str:
    """Every memory an arm keeps, both fault mixes, summed over seeds; wrong and stale values
    are both wrong lines (a value the ledger contradicts at the item the version covers)."""
    chosen = _select(runs, size=size)
    mixes = list(dict.fromkeys(r.faults for r in chosen))
    lines = [
        f"#### Memory audit: {size}, every seed summed ({reader})",
        "",
        "| arm | faults | memory | versions | value lines | wrong lines | per 1,000 "
        "| counters ever wrong | missing lines | re-asks |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for arm in arms_in(chosen):
        for mix in mixes:
            group = _select(chosen, arm=arm, faults=mix)
            audits = [r.audit for r in group if r.audit is not None]
            if not group:
                continue
            if not audits:
                lines.append(f"| {arm} | {mix} | none kept | – | – | – | – | – | – | – |")
                continue
            total = sum(int(a["total_lines"]) for a in audits)
            wrong = sum(len(a["wrong_lines"]) for a in audits)
            ever = sum(len(a["counters_ever_wrong"]) for a in audits)
            missing = sum(int(a["missing_lines"]) for a in audits)
            versions = sum(int(a["versions_audited"]) for a in audits)
            reasks = [r.reasks for r in group if r.reasks is not None]
            per = f"{1000 * wrong / total:.1f}" if total else "–"
            lines.append(
                f"| {arm} | {mix} | {audits[0].get('memory', 'notes')} | {versions} | {total:,} | "
                f"{wrong} | {per} | {ever} | {missing:,} | {sum(reasks) if reasks else '–'} |"
            )
    return "\n".join(lines) + "\n"
