"""The keeper's CPU by phase in each tenth of a notes-cost run, as a table.

Beside the keeper's CPU per tenth, which only says whether it grows, this says which part of the
work grows: a phase that follows the cuts (the note request, the commit, indexing) moves with how
often the NOTES are taken; one that follows the steps (preparing them) with the stream; the
search with how many questions reach into the archive.

Pure: the clock (``clock.py``) measures, ``tenths.py`` splits the marks into tenths.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from keeper_bench.notes_cost.clock import PHASE_MEANINGS


def median_phases(runs: Sequence[Sequence[Mapping[str, float]]]) -> list[dict[str, float]]:
    """``runs``: each run's CPU per phase in each tenth; the median of the runs, phase by phase."""
    if not runs:
        raise ValueError("combining needs at least one run; got none")
    if len({len(run) for run in runs}) > 1:
        raise ValueError(f"every run needs the same tenths; got lengths {[len(r) for r in runs]}")
    return [
        {name: statistics.median(row[name] for row in rows) for name in rows[0]}
        for rows in zip(*runs, strict=True)
    ]


def _change(first: float, last: float) -> str:
    return f"{(last / first - 1) * 100:+.0f}%" if first else "n/a"


def render_phases(result: Mapping[str, Any]) -> list[str]:
    """The table's lines: each tenth's CPU per phase per 100K, the last vs the first, and what
    each phase is."""
    rows: list[dict[str, float]] = result["phases"]
    names = list(rows[0])
    repeat = result.get("repeat")
    title = "The keeper's CPU by phase, s / 100K stream tokens" + (
        f" (median of {repeat} runs, phase by phase)" if repeat else ""
    )
    lines = [
        f"{title}:",
        "",
        "| tenth | " + " | ".join(names) + " | all |",
        "| --- |" + " --- |" * (len(names) + 1),
    ]
    for number, row in enumerate(rows, start=1):
        cells = [f"{row[name]:.3f}" for name in names]
        lines.append(f"| {number} | " + " | ".join(cells) + f" | {sum(row.values()):.3f} |")
    first, last = rows[0], rows[-1]
    changes = [_change(first[name], last[name]) for name in names]
    changes.append(_change(sum(first.values()), sum(last.values())))
    lines.append("| last vs first | " + " | ".join(changes) + " |")
    lines += ["", *(f"- {name}: {PHASE_MEANINGS.get(name, name)}" for name in names)]
    if repeat:
        lines.append(
            "- all: the sum of the phases' medians, which need not be the median of the sums "
            "in the table above"
        )
    return lines
