"""Which tenth of the stream each call and each second of keeper CPU belongs to, and what comes
after the stream.

A run's cost is given per 100K stream tokens in each tenth of the stream. The final question set
is asked after the stream's last token: its calls (a few dozen work calls, several after a
search) add no stream tokens, so "per 100K stream tokens" means nothing for them. Folded into the
last tenth, as the table first did, they made that tenth look dearer than the others by what the
questions cost (at 240K, where a tenth is 24K tokens: prompt +56% first to last, of which the
final questions were most). So they are their own row, given as totals, and the tenths are tenths
of the stream up to its last batch. The folded figure is kept beside it, labelled, so the two
readings can be compared.

Pure: the caller reads the run's files and measures the CPU.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keeper_bench.costs import CallRecord, prefix_reuse

TENTHS = 10
STREAM_END_FILE = "stream_end.json"
"""Where a notes-cost run records where its stream ended (stream tokens, calls made by then)."""

FIGURES = ("prompt", "uncached", "keeper_cpu_s")


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamEnd:
    """Where the stream ended: its tokens up to the last step before the final questions, and
    how many model calls the run had made by then."""

    tokens: int
    calls: int

    def __post_init__(self) -> None:
        if self.tokens < 0 or self.calls < 0:
            raise ValueError(
                f"a stream's end is a size and a count, never negative; got tokens={self.tokens}, "
                f"calls={self.calls}"
            )

    def save(self, run_dir: Path) -> None:
        text = json.dumps({"tokens": self.tokens, "calls": self.calls})
        (run_dir / STREAM_END_FILE).write_text(text + "\n", encoding="utf-8")

    @classmethod
    def load(cls, run_dir: Path) -> StreamEnd | None:
        """The run's stream end, or None for a run made before it was recorded."""
        path = run_dir / STREAM_END_FILE
        if not path.exists():
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
        return cls(tokens=int(data["tokens"]), calls=int(data["calls"]))


@dataclass(frozen=True, slots=True, kw_only=True)
class Mark:
    """The keeper's CPU so far at the end of one step, and where in the stream the step was."""

    history_tokens: int
    keeper_cpu_s: float
    after_stream: bool
    """The step asked the final questions (after the stream's last token)."""
    phases: Mapping[str, float] = field(default_factory=dict)
    """The keeper's CPU so far in each of its phases (``clock.PHASES``); empty when not timed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Attribution:
    """Raw sums (not per 100K) per tenth, after the stream, and folded the old way."""

    tenths: list[dict[str, float]]
    """Tenths of the stream up to its end; the final questions are not in them."""
    after: dict[str, float]
    """The calls and CPU after the stream's last token (totals), and how many calls."""
    folded: list[dict[str, float]]
    """Tenths of the whole run with the final questions in the last one (the earlier figure)."""
    width: float
    """Stream tokens in a tenth (the stream up to its end)."""
    folded_width: float
    """Stream tokens in a tenth of the folded figure (the final questions' text included)."""
    phase_tenths: list[dict[str, float]] = field(default_factory=list)
    """The keeper's CPU per phase in each tenth of the stream (empty: phases not timed)."""
    phase_after: dict[str, float] = field(default_factory=dict)
    """The keeper's CPU per phase after the stream's last token."""

    def per_100k(self, rows: Sequence[Mapping[str, float]], width: float) -> list[dict[str, float]]:
        scale = 100_000 / width
        return [{key: row[key] * scale for key in FIGURES} for row in rows]

    def totals(self) -> dict[str, float]:
        """The whole run's prompt, uncached and keeper CPU (the same however it is split)."""
        return {key: sum(row[key] for row in self.tenths) + self.after[key] for key in FIGURES}


def _zeros() -> dict[str, float]:
    return dict.fromkeys(FIGURES, 0.0)


def attribute(
    calls: Iterable[CallRecord],
    by_item: Mapping[int, int],
    marks: Sequence[Mark],
    end: StreamEnd | None,
) -> Attribution:
    """Split the run's calls (in order) and CPU marks into tenths of the stream and after it.

    ``by_item``: item → stream tokens up to and including it. Without ``end`` (a run recorded
    before the stream's end was), everything is in the tenths, as before.
    """
    total = max(by_item.values(), default=0) or 1
    stream_tokens = end.tokens if end is not None and end.tokens > 0 else total
    width, folded_width = stream_tokens / TENTHS, total / TENTHS
    items = sorted(by_item)
    first_history = by_item[items[0]] if items else 0
    tenths = [_zeros() for _ in range(TENTHS)]
    folded = [_zeros() for _ in range(TENTHS)]
    after = {**_zeros(), "calls": 0.0}
    previous: CallRecord | None = None
    for index, record in enumerate(calls):
        history = by_item.get(record.item, first_history)
        reused = prefix_reuse(previous, record).tokens_estimate if previous else 0
        uncached = max(0, record.prompt_tokens - reused)
        previous = record
        old = folded[min(TENTHS - 1, int(history / folded_width))]
        old["prompt"] += record.prompt_tokens
        old["uncached"] += uncached
        if end is not None and index >= end.calls:
            row = after
            after["calls"] += 1
        else:
            row = tenths[min(TENTHS - 1, int(history / width))]
        row["prompt"] += record.prompt_tokens
        row["uncached"] += uncached
    spent_before = 0.0
    names = list(marks[-1].phases) if marks else []
    phase_tenths = [dict.fromkeys(names, 0.0) for _ in range(TENTHS)]
    phase_after = dict.fromkeys(names, 0.0)
    phases_before = dict.fromkeys(names, 0.0)
    for mark in marks:
        spent = mark.keeper_cpu_s - spent_before
        spent_before = mark.keeper_cpu_s
        folded[min(TENTHS - 1, int(mark.history_tokens / folded_width))]["keeper_cpu_s"] += spent
        if end is not None and mark.after_stream:
            after["keeper_cpu_s"] += spent
            phase_row = phase_after
        else:
            tenth = min(TENTHS - 1, int(mark.history_tokens / width))
            tenths[tenth]["keeper_cpu_s"] += spent
            phase_row = phase_tenths[tenth]
        for name in names:
            now = mark.phases.get(name, phases_before[name])
            phase_row[name] += now - phases_before[name]
            phases_before[name] = now
    return Attribution(
        tenths=tenths,
        after=after,
        folded=folded,
        width=width,
        folded_width=folded_width,
        phase_tenths=phase_tenths if names else [],
        phase_after=phase_after,
    )


def read_calls(run_dir: Path) -> Iterator[CallRecord]:
    """The run's model calls, in the order they were made, one at a time (a 10M-token run makes
    some 10,000, and the run's peak memory is measured after they are read)."""
    with (run_dir / "calls.jsonl").open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield CallRecord.from_json(json.loads(line))


def calls_in_first_bytes(path: Path, size: int) -> int:
    """How many complete call lines the first ``size`` bytes of ``calls.jsonl`` hold."""
    if size <= 0 or not path.exists():
        return 0
    with path.open("rb") as handle:
        return handle.read(size).count(b"\n")


def figures(attribution: Attribution) -> dict[str, Any]:
    """The JSON the cost table is rendered from: per 100K in the tenths, totals after them."""
    return {
        "tenths": attribution.per_100k(attribution.tenths, attribution.width),
        "after_stream": dict(attribution.after),
        "folded_tenths": attribution.per_100k(attribution.folded, attribution.folded_width),
        "stream_tokens": round(attribution.width * TENTHS),
        "totals": attribution.totals(),
        **_phase_figures(attribution),
    }


def _phase_figures(attribution: Attribution) -> dict[str, Any]:
    """The keeper's CPU by phase: per 100K in the tenths, totals after them (none if untimed)."""
    if not attribution.phase_tenths:
        return {}
    scale = 100_000 / attribution.width
    return {
        "phases": [
            {name: seconds * scale for name, seconds in row.items()}
            for row in attribution.phase_tenths
        ],
        "phases_after_stream": dict(attribution.phase_after),
    }


def _change(first: float, last: float) -> str:
    return f"{(last / first - 1) * 100:+.0f}%" if first else "n/a"


def _cpu(value: float, span: Sequence[float] | None, unit: str = "") -> str:
    """A keeper CPU cell: the figure, and with several runs the lowest and highest beside it."""
    if span is None:
        return f"{value:.2f}{unit}"
    return f"{value:.2f}{unit} ({span[0]:.2f}–{span[1]:.2f})"


def _runs_change(changes: Sequence[float | None]) -> str:
    return ", ".join("n/a" if change is None else f"{change * 100:+.0f}%" for change in changes)


def render_tenths(result: Mapping[str, Any]) -> list[str]:
    """The cost table's lines: ten tenths, the row after the stream, the changes, the old figure.

    With several runs combined (``keeper_cpu_spread``), the keeper CPU is their median with the
    lowest and highest run beside it, and each run's last-vs-first change beside the median's.
    """
    rows = result["tenths"]
    spread = result.get("keeper_cpu_spread")
    cpu_label = (
        "keeper CPU s / 100K"
        if spread is None
        else f"keeper CPU s / 100K, median of {result['repeat']} runs (lowest–highest)"
    )
    lines = [
        f"| tenth | prompt tok / 100K | uncached prompt tok / 100K (≈) | {cpu_label} |",
        "| --- | --- | --- | --- |",
    ]
    for number, row in enumerate(rows, start=1):
        span = spread["tenths"][number - 1] if spread else None
        lines.append(
            f"| {number} | {row['prompt']:,.0f} | {row['uncached']:,.0f} | "
            f"{_cpu(row['keeper_cpu_s'], span)} |"
        )
    after = result.get("after_stream")
    if after and after.get("calls"):
        span = spread.get("after_stream") if spread else None
        lines.append(
            f"| after the stream ({after['calls']:,.0f} call{'' if after['calls'] == 1 else 's'}: "
            "the final questions; totals, not "
            f"per 100K) | {after['prompt']:,.0f} | {after['uncached']:,.0f} | "
            f"{_cpu(after['keeper_cpu_s'], span, ' s')} |"
        )
    first, last = rows[0], rows[-1]
    changes = [_change(first[k], last[k]) for k in FIGURES]
    if spread:
        changes[-1] += f" (runs: {_runs_change(spread['last_vs_first_runs'])})"
    lines.append("| last vs first | " + " | ".join(changes) + " |")
    inner = rows[1:-1]
    if inner:
        lines.append(
            "| tenths 2–9, max vs min | "
            + " | ".join(
                _change(min(r[k] for r in inner), max(r[k] for r in inner)) for k in FIGURES
            )
            + " |"
        )
    folded = result.get("folded_tenths")
    if folded and after and after.get("calls"):
        old_first, old_last = folded[0], folded[-1]
        span = spread["folded_tenths"][-1] if spread and "folded_tenths" in spread else None
        lines += [
            "| old figure: tenth 10 with the final questions in it | "
            f"{old_last['prompt']:,.0f} | {old_last['uncached']:,.0f} | "
            f"{_cpu(old_last['keeper_cpu_s'], span)} |",
            "| old figure: last vs first | "
            + " | ".join(_change(old_first[k], old_last[k]) for k in FIGURES)
            + " |",
        ]
    return lines
