"""The results file of ``keeper-bench proxy-overhead``: the main table's header, the verdict on
each target row by row, and the notes that say what each column measured (pure, but for the
commit it names).
"""

from __future__ import annotations

import os
import statistics
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from keeper_bench.proxy.overhead import Row

__all__ = ["HEADER", "TARGET_RATIO", "TARGET_THROUGHPUT", "results_markdown", "verdict"]

TARGET_RATIO = 2.0
"""keeper-proxy's CPU per request at most this many times the fair floor's (the relay that also
parses each body and commits one SQLite row)."""
TARGET_THROUGHPUT = 0.5
"""keeper-proxy's throughput at 32 sessions at least this share of the fair floor's."""


HEADER = (
    "| upstream | sessions | path | requests a pass | throughput (req/s) | p50 (ms) | "
    "relay, floor or proxy CPU a request (ms) | upstream CPU a request (ms) | "
    "proxy ÷ floor CPU | proxy ÷ keeping floor CPU | "
    "cuts | load avg |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def _commit(checkout: Path | None = None) -> str:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=checkout or Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return done.stdout.strip() or "unknown"


def verdict(rows: Sequence[Row]) -> list[str]:
    """The targets, row by row: keeper-proxy's CPU per request against twice the fair floor's,
    and at 32 sessions its throughput against half the floor's."""
    lines = []
    for row in rows:
        ratios = row.ratios()
        if not ratios:
            continue
        ratio = statistics.median(ratios)
        met = "met" if ratio <= TARGET_RATIO else "not met"
        lines.append(
            f"- {row.upstream} upstream, {row.sessions} session(s): keeper-proxy spends "
            f"{ratio:.2f}× the fair floor's CPU a request (median of {len(ratios)} passes): "
            f"{met}."
        )
        kept = row.ratios("keeping")
        if kept:
            lines.append(
                f"- {row.upstream} upstream, {row.sessions} session(s): keeper-proxy spends "
                f"{statistics.median(kept):.2f}× the keeping floor's CPU a request (a reference, "
                "not a target)."
            )
        floor = statistics.median(p.rps for p in row.passes["floor"])
        proxy = statistics.median(p.rps for p in row.passes["keeper-proxy"])
        if row.sessions >= 32 and floor:
            share = proxy / floor
            met = "met" if share >= TARGET_THROUGHPUT else "not met"
            lines.append(
                f"- {row.upstream} upstream, {row.sessions} sessions: keeper-proxy's throughput "
                f"is {share:.0%} of the fair floor's ({proxy:.0f} against {floor:.0f} req/s; "
                f"target ≥ {TARGET_THROUGHPUT:.0%}): {met}."
            )
            keeping = [p.rps for p in row.passes["keeping"]]
            if keeping and statistics.median(keeping):
                rate = statistics.median(keeping)
                lines.append(
                    f"- {row.upstream} upstream, {row.sessions} sessions: keeper-proxy's "
                    f"throughput is {proxy / rate:.0%} of the keeping floor's ({rate:.0f} req/s)."
                )
    return lines


def results_markdown(
    rows: Sequence[Row],
    *,
    label: str,
    window: int,
    command: str,
    seconds: float,
    growth: Sequence[str] = (),
) -> str:
    cores = os.cpu_count() or 0
    main = [HEADER, *(line for row in rows for line in row.lines()), "", *verdict(rows), ""]
    main = main if rows else []
    return "\n".join(
        [
            "# keeper-proxy's overhead beside a bare relay",
            "",
            f"Each session ({label}) resends its whole history on every call; keeper-proxy's "
            f"window is {window:,} tokens and no request makes a cut. The upstream, the "
            "relay and keeper-proxy each run in their own process; the sessions share one event "
            "loop in a fourth. Figures are medians over the passes, with their range.",
            "",
            *main,
            "- *fair floor*: the bare relay that also parses each JSON body (orjson) and commits "
            "one SQLite row per request (WAL, synchronous=NORMAL) before forwarding it.",
            "- *keeping floor*: the least a proxy does under keeper-proxy's own rules "
            "(`python -m keeper_bench.proxy.relay --keeping FILE`): beyond the fair floor it "
            "encodes its own upstream body, keeps each reply with the request's new turn in one "
            "committed row, and does its token count and SQLite work in worker threads, never "
            "on the event loop (two hand-offs a request). *proxy ÷ keeping floor* is what the "
            "keeper itself adds; a reference beside the target, not the target.",
            "- *relay, floor or proxy CPU a request*: that process's user + system CPU time over a pass "
            "(read from the process, `/proc/<pid>/task/*/schedstat`), divided by the pass's "
            "requests. It moves far less with other jobs' load than wall-clock time does.",
            "- *upstream CPU a request*: the same for the upstream; the relay and keeper-proxy "
            "each answer one HTTP request and make one per request, as the upstream answers one.",
            "- *proxy ÷ floor CPU*: pass by pass (the passes run interleaved: direct, relay, "
            "floor, keeper-proxy, direct, ...). The target is at most "
            f"{TARGET_RATIO:g}× for requests without a cut.",
            "- *throughput*: requests a second over the pass, all sessions together; *p50*: the "
            "median round trip one session saw.",
            f"- *load avg*: the 1-minute load average before and after the row, on {cores} cores "
            "shared with other work.",
            "",
            *growth,
            f"Measured at commit {_commit()} with `{command}` ({seconds / 60:.1f} minutes).",
            "",
        ]
    )
