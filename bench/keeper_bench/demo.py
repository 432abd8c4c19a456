"""``keeper-bench demo``: every arm and peer on one small stream, with the simulated reader.

The stream has the standing rules and the rule that names nothing ("any figure below zero is
reported as overdrawn"), and the window holds about 25 batches, as 32K tokens held about 25 of
the lab's batches. So in a few minutes on a laptop it shows what each way of managing context
keeps, read by one simulated reader for every arm: retrieval alone never finds the rule that names
nothing, dropping old turns loses everything beyond the window, and notes and summaries differ in
what they keep of old values and actors. Every figure is labelled "simulated reader": it measures
the method with one reading skill for every arm, not a model's score.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from keeper_bench.cli import Command
from keeper_bench.compare import Comparison, compare_arms
from keeper_bench.grader import GradeResult
from keeper_bench.run_options import resolve_stream

DEMO_STREAM = "small:rules+overdrawn"
DEMO_WINDOW = 6_144
"""About 25 of the small preset's ~200-token batches, after the reply reserve."""
FAR_BUCKETS = ("25–99", "100–399", "400+")


def highlights(results: Sequence[GradeResult]) -> str:
    """The few numbers the demo is about, one line per arm."""
    lines = ["| run | answerable right | rule naming nothing (overdrawn) | 25+ batches back |"]
    lines.append("| --- | --- | --- | --- |")
    for result in results:
        answerable = [q for q in result.scored if q.category != "unknown"]
        far = [q for q in result.scored if q.bucket in FAR_BUCKETS]
        overdrawn = result.by_category.get("overdrawn", (0, 0))
        lines.append(
            f"| {result.label} | {sum(q.right for q in answerable)}/{len(answerable)} | "
            f"{overdrawn[0]}/{overdrawn[1]} | {sum(q.right for q in far)}/{len(far)} |"
        )
    return "\n".join(lines) + "\n"


def run_demo(
    out: Path | str = Path("runs/demo"),
    *,
    arms: Sequence[str] | None = None,
    stream: str = DEMO_STREAM,
    window: int = DEMO_WINDOW,
    progress: bool = True,
) -> Comparison:
    from keeper_bench.arms import ARMS

    folder = Path(out)
    stream_folder = resolve_stream(stream, folder / "stream")
    return compare_arms(
        list(arms or ARMS), stream_folder, folder, progress=progress, model="sim", window=window
    )


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("runs/demo"), help="output folder")
    parser.add_argument("--arms", default="", help="comma-separated arms (default: every arm)")
    parser.add_argument("--stream", default=DEMO_STREAM, help="a stream folder or a preset")
    parser.add_argument("--window", type=int, default=DEMO_WINDOW)
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def _run(args: argparse.Namespace) -> int:
    from keeper_bench.compare import parse_arms

    started = time.perf_counter()
    comparison = run_demo(
        args.out,
        arms=parse_arms(args.arms),
        stream=args.stream,
        window=args.window,
        progress=not args.quiet,
    )
    seconds = time.perf_counter() - started
    print(comparison.report)
    print("### What to look for (simulated reader)\n")
    print(highlights(comparison.results))
    for plot in comparison.plots:
        print(f"plot: {plot}")
    print(f"report: {comparison.out / 'report.md'}")
    print(f"demo finished in {seconds / 60:.1f} minutes", file=sys.stderr)
    return 0


def register_commands(register: Callable[[Command], None]) -> None:
    register(
        Command(
            "demo",
            "every arm on a small stream with the simulated reader: tables and plots",
            _configure,
            _run,
        )
    )
