"""What each tenth of a ``notes-cost`` run is made of, so a change in cost can be traced to a cause.

Per tenth of the stream: work calls (and how many of them followed a search), notes calls and
re-asks, cuts, the NOTES' size a work call carried on average, the average prompt of a work
call and of a notes call, archive searches and the tokens their results added, and the entries
that left the NOTES for the archive. Read from a finished run folder: ``calls.jsonl`` (one line
per model call) and the keeper's ``archive.sqlite3`` (NOTES versions and archived turns).

Sizes are the simulated reader's estimate (about four characters a token), as in the cost table.
With the stream's end recorded (``stream_end.json``), the final questions, asked after the
stream's last token, are an eleventh row of their own, as in the cost table.
"""

from __future__ import annotations

import bisect
import json
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from keeper_bench.notes_cost.tenths import StreamEnd
from keeper_middleware.notes.budget import MOVED_TURN_NAME
from keeper_middleware.search.schema import SEARCH_TOOL_NAME

TENTHS = 10
_COLUMNS = (
    ("work_calls", "work calls", "{:,.0f}"),
    ("after_search", "of them after a search", "{:,.0f}"),
    ("notes_calls", "notes calls", "{:,.0f}"),
    ("reasks", "re-asks", "{:,.0f}"),
    ("notes_per_work_call", "NOTES tok / work call", "{:,.0f}"),
    ("work_prompt_avg", "work call prompt (avg)", "{:,.0f}"),
    ("notes_prompt_avg", "notes call prompt (avg)", "{:,.0f}"),
    ("searches", "search results", "{:,.0f}"),
    ("search_tokens", "search result tok", "{:,.0f}"),
    ("moved", "NOTES entries moved out", "{:,.0f}"),
)


def breakdown(
    run_dir: Path, by_item: dict[int, int], end: StreamEnd | None = None
) -> list[dict[str, float]]:
    """Per tenth of the stream (``by_item``: item → stream tokens so far), what the run did; with
    ``end``, an eleventh row for what was done after the stream (the final questions)."""
    total = max(by_item.values(), default=0) or 1
    width = (end.tokens if end is not None and end.tokens > 0 else total) / TENTHS
    items = sorted(by_item)
    after_seq = _final_step_seq(run_dir) if end is not None else None

    def tenth(item: int | None) -> int:
        history = by_item.get(item if item is not None else -1, by_item[items[0]] if items else 0)
        return min(TENTHS - 1, int(history / width))

    keys = [key for key, _, _ in _COLUMNS]
    count = TENTHS + (1 if end is not None else 0)
    rows: list[dict[str, float]] = [dict.fromkeys(keys, 0.0) for _ in range(count)]
    prompts = [{"work": 0.0, "notes": 0.0} for _ in range(count)]
    # a NOTES version's size, from the item it covers to the next (a call carries the latest)
    with sqlite3.connect(f"file:{run_dir / 'archive.sqlite3'}?mode=ro", uri=True) as con:
        versions = con.execute(
            "SELECT last_item, length(text) FROM notes WHERE last_item IS NOT NULL ORDER BY version"
        ).fetchall()
        turns = con.execute(
            "SELECT name, item, length(content), content, seq FROM turns WHERE name IN (?, ?)",
            (SEARCH_TOOL_NAME, MOVED_TURN_NAME),
        ).fetchall()
    covered = [int(last) for last, _ in versions]
    sizes = [length // 4 for _, length in versions]
    last_work_item: int | None = None
    with (run_dir / "calls.jsonl").open(encoding="utf-8") as handle:
        for index, line in enumerate(line for line in handle if line.strip()):
            call = json.loads(line)
            at_row = TENTHS if end is not None and index >= end.calls else tenth(call["item"])
            if end is not None and index == end.calls:
                last_work_item = None  # the final questions' first call follows no search
            row = rows[at_row]
            kind = call["kind"]
            if kind == "work":
                row["work_calls"] += 1
                prompts[at_row]["work"] += call["prompt_tokens"]
                at = bisect.bisect_left(covered, call["item"]) - 1
                row["notes_per_work_call"] += sizes[at] if at >= 0 else 0
                if call["item"] == last_work_item:
                    row["after_search"] += 1
                last_work_item = call["item"]
            elif kind == "notes":
                row["notes_calls"] += 1
                prompts[at_row]["notes"] += call["prompt_tokens"]
            elif kind == "reask":
                row["reasks"] += 1
    for name, item, length, content, seq in turns:
        row = rows[TENTHS if after_seq is not None and seq > after_seq else tenth(item)]
        if name == SEARCH_TOOL_NAME:
            row["searches"] += 1
            row["search_tokens"] += length // 4
        else:
            row["moved"] += sum(1 for text in content.splitlines() if text.startswith("- "))
    for row, prompt in zip(rows, prompts, strict=True):
        work = row["work_calls"] or 1
        row["notes_per_work_call"] /= work
        row["work_prompt_avg"] = prompt["work"] / work
        row["notes_prompt_avg"] = prompt["notes"] / (row["notes_calls"] or 1)
    return rows


def _final_step_seq(run_dir: Path) -> int | None:
    """The archive position of the final questions' message (None: not archived, or none)."""
    answers = run_dir / "answers.jsonl"
    if not answers.exists():
        return None
    steps = [
        int(record["step"])
        for record in map(json.loads, filter(str.strip, answers.read_text("utf-8").splitlines()))
        if record.get("final")
    ]
    if not steps:
        return None
    with sqlite3.connect(f"file:{run_dir / 'archive.sqlite3'}?mode=ro", uri=True) as con:
        found = con.execute(
            "SELECT seq FROM turns WHERE msg_id = ?", (f"step-{min(steps)}",)
        ).fetchone()
    return int(found[0]) if found else None


def render_breakdown(rows: Sequence[dict[str, Any]]) -> str:
    """The breakdown as a markdown table, one row per tenth."""
    lines = [
        "| tenth | " + " | ".join(label for _, label, _ in _COLUMNS) + " |",
        "| --- " * (len(_COLUMNS) + 1) + "|",
    ]
    for number, row in enumerate(rows, start=1):
        cells = [form.format(row[key]) for key, _, form in _COLUMNS]
        label = "after the stream" if number > TENTHS else str(number)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cost_per_cut(
    tenths: Sequence[Mapping[str, float]], rows: Sequence[Mapping[str, float]], stream_tokens: int
) -> list[float | None]:
    """Each tenth's keeper CPU (seconds) over the cuts it made (its notes calls), None where it
    made none.

    Most of the keeper's work is done when a cut archives what came in before it, so a tenth's
    CPU follows how many cuts fall in it: the first cut waits for the window to fill, and a tenth
    of a short stream holds only a few cuts, so one cut more or less moves its cost by a tenth
    or more. The cost of a cut says whether the work itself grows.
    """
    width = stream_tokens / TENTHS
    return [
        tenth["keeper_cpu_s"] * width / 100_000 / row["notes_calls"] if row["notes_calls"] else None
        for tenth, row in zip(tenths, rows[:TENTHS], strict=False)
    ]


def render_cost_per_cut(result: Mapping[str, Any]) -> str:
    """One sentence: the keeper CPU a cut in the first and last tenth, and the range between."""
    costs = cost_per_cut(result["tenths"], result.get("breakdown") or [], result["stream_tokens"])
    if len(costs) < TENTHS or costs[0] is None or costs[-1] is None:
        return ""
    inner = [cost for cost in costs[1:-1] if cost is not None]
    between = f"; tenths 2–9 {min(inner) * 1000:.1f}–{max(inner) * 1000:.1f} ms" if inner else ""
    change = (costs[-1] / costs[0] - 1) * 100
    return (
        "Keeper CPU a cut (each tenth's keeper CPU over its notes calls): first tenth "
        f"{costs[0] * 1000:.1f} ms, last {costs[-1] * 1000:.1f} ms ({change:+.0f}%){between}."
    )
