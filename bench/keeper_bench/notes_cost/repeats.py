"""Several runs of one size combined into one result: the keeper's CPU is their median.

The keeper's CPU time of one run is not a steady figure on a shared machine: a garbage
collection pause or a neighbour's job moves a tenth by ±15% and the last-vs-first change by
ten points, so one run cannot tell a 15% trend from noise. Run the same size N times and the
median per tenth is a figure worth comparing; the lowest and highest run stand beside it, and
each run's own last-vs-first change too, so the reader sees how far the runs were apart.

Everything else a run reports (prompt and uncached tokens, the score, cuts, searches, the NOTES,
what each tenth is made of) comes from the simulated reader and must be the same in every run.
If it is not, the run is not deterministic, and a median would hide that: combining refuses.

Pure: the caller runs the processes and reads their JSON.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from keeper_bench.notes_cost.phases import median_phases

CPU = "keeper_cpu_s"
_TOKEN_FIGURES = ("prompt", "uncached")
_AFTER_FIGURES = ("prompt", "uncached", "calls")
_RUN_FIGURES = (
    "size",
    "arm",
    "window",
    "score",
    "stream_tokens",
    "notes_tokens",
    "notes_entries",
    "notes_entries_moved",
    "cuts",
    "searches",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Disagreement:
    """One figure that should be the same in every run and is not."""

    figure: str
    values: tuple[Any, ...]
    """The figure in each run, in run order."""


class RunsDisagreeError(ValueError):
    """Runs of the same size gave different deterministic figures (a ``ValueError``, so the
    command reports it as a plain error)."""


def median_per_tenth(runs: Sequence[Sequence[float]]) -> list[float]:
    """``runs``: each run's value per tenth; the median of the runs in each tenth."""
    _same_length(runs)
    return [statistics.median(values) for values in zip(*runs, strict=True)]


def span_per_tenth(runs: Sequence[Sequence[float]]) -> list[tuple[float, float]]:
    """The lowest and highest run in each tenth."""
    _same_length(runs)
    return [(min(values), max(values)) for values in zip(*runs, strict=True)]


def last_vs_first(values: Sequence[float]) -> float | None:
    """The change from the first tenth to the last, as a fraction (None: the first is zero)."""
    return values[-1] / values[0] - 1 if values and values[0] else None


def _same_length(runs: Sequence[Sequence[float]]) -> None:
    if not runs:
        raise ValueError("combining needs at least one run; got none")
    if len({len(run) for run in runs}) > 1:
        raise ValueError(f"every run needs the same tenths; got lengths {[len(r) for r in runs]}")


def _deterministic(result: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """Each figure of one run's result that the simulated reader fixes, with a readable name."""
    for key in _RUN_FIGURES:
        if key in result:
            yield key, result[key]
    for number, row in enumerate(result.get("tenths", []), start=1):
        for key in _TOKEN_FIGURES:
            yield f"tenth {number} {key} tok / 100K", row[key]
    for key in _AFTER_FIGURES:
        if key in result.get("after_stream", {}):
            yield f"after the stream {key}", result["after_stream"][key]
    for number, row in enumerate(result.get("folded_tenths", []), start=1):
        for key in _TOKEN_FIGURES:
            yield f"old figure tenth {number} {key} tok / 100K", row[key]
    for key in _TOKEN_FIGURES:
        if key in result.get("totals", {}):
            yield f"total {key} tok", result["totals"][key]
    for number, row in enumerate(result.get("breakdown") or [], start=1):
        label = "after the stream" if number > len(result.get("tenths", [])) else f"tenth {number}"
        for key, value in row.items():
            yield f"breakdown {label} {key}", value


def disagreements(runs: Sequence[Mapping[str, Any]]) -> list[Disagreement]:
    """The deterministic figures that are not the same in every run (none: the runs agree).

    A figure missing from some run counts as a disagreement (its value there is None).
    """
    per_run = [dict(_deterministic(run)) for run in runs]
    names = list(dict.fromkeys(name for figures in per_run for name in figures))
    found = []
    for name in names:
        values = tuple(figures.get(name) for figures in per_run)
        if any(value != values[0] for value in values[1:]):
            found.append(Disagreement(figure=name, values=values))
    return found


def check_agreement(size: str, runs: Sequence[Mapping[str, Any]]) -> None:
    """Raise ``RunsDisagreeError`` naming the size, the figures and each run's value if they differ."""
    found = disagreements(runs)
    if not found:
        return
    shown = "; ".join(
        f"{item.figure}: " + ", ".join(f"run {n} {v!r}" for n, v in enumerate(item.values, 1))
        for item in found[:5]
    )
    more = f" (and {len(found) - 5} more)" if len(found) > 5 else ""
    raise RunsDisagreeError(
        f"notes-cost {size}: the {len(runs)} runs disagree on {len(found)} figure(s) the "
        f"simulated reader should fix: {shown}{more}. The run is not deterministic; a median of "
        "its keeper CPU would hide that, so nothing was combined."
    )


def combine(size: str, runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One result from ``runs`` of the same size: the first run's deterministic figures, the
    median keeper CPU per tenth (and after the stream, and in the old folded figure), their
    spread, each run's last-vs-first CPU change, and the largest peak RSS.

    One run is returned as it is, so a single run's table and JSON stay what they were.
    """
    if not runs:
        raise ValueError(f"notes-cost {size}: combining needs at least one run; got none")
    if len(runs) == 1:
        return dict(runs[0])
    check_agreement(size, runs)
    cpu = [[row[CPU] for row in run["tenths"]] for run in runs]
    combined: dict[str, Any] = {
        **runs[0],
        "repeat": len(runs),
        "runs_seconds": [run["seconds"] for run in runs],
        "runs_peak_rss_mb": [run["peak_rss_mb"] for run in runs],
        "runs_keeper_cpu_s": cpu,
        "peak_rss_mb": max(run["peak_rss_mb"] for run in runs),
        "seconds": round(sum(run["seconds"] for run in runs), 1),
    }
    medians = median_per_tenth(cpu)
    combined["tenths"] = [
        {**row, CPU: value} for row, value in zip(runs[0]["tenths"], medians, strict=True)
    ]
    spread: dict[str, Any] = {
        "tenths": span_per_tenth(cpu),
        "last_vs_first_runs": [last_vs_first(values) for values in cpu],
    }
    if "folded_tenths" in runs[0]:
        folded = [[row[CPU] for row in run["folded_tenths"]] for run in runs]
        combined["folded_tenths"] = [
            {**row, CPU: value}
            for row, value in zip(runs[0]["folded_tenths"], median_per_tenth(folded), strict=True)
        ]
        spread["folded_tenths"] = span_per_tenth(folded)
    for key in ("after_stream", "totals"):
        if key in runs[0]:
            values = [run[key][CPU] for run in runs]
            combined[key] = {**runs[0][key], CPU: statistics.median(values)}
            spread[key] = (min(values), max(values))
    combined["keeper_cpu_spread"] = spread
    if all(run.get("phases") for run in runs):
        combined["phases"] = median_phases([run["phases"] for run in runs])
    return combined
