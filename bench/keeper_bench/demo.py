"""``keeper-bench demo``: every arm and peer on one small stream, with the simulated reader.

The stream has the standing rules and the rule that names nothing ("any figure below zero is
reported as overdrawn"), and the window holds about 25 batches, as 32K tokens held about 25 of
the lab's batches. So in a few minutes on a laptop it shows what each way of managing context
keeps, read by one simulated reader for every arm: retrieval alone never finds the rule that names
nothing, dropping old turns loses everything beyond the window, and notes and summaries differ in
what they keep of old values and actors. The same arms also run on the rules-free stream of the same
size (no standing rules, no rule that names nothing), headlined beside the rules stream: the
keeper repeats its RULES at every question, and a reader of the tables should see what each arm
scores where no rule is at stake. Every figure is labelled "simulated reader": it measures
the method with one reading skill for every arm, not a model's score.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from keeper_bench.cli import Command
from keeper_bench.compare import Comparison, compare_arms
from keeper_bench.grader import GradeResult
from keeper_bench.run_options import resolve_stream
from keeper_bench.streams import SIZES

DEMO_STREAM = "small:rules+overdrawn"
RULE_FAMILIES = frozenset({"rules", "overdrawn"})
"""The families that put rules in a stream; the rules-free stream leaves them out."""
DEMO_WINDOW = 6_144
"""About 25 of the small preset's ~200-token batches, after the reply reserve."""
FAR_BUCKETS = ("25–99", "100–399", "400+")


def rules_free_stream(stream: str) -> str | None:
    """The rules-free preset of the same size as ``stream`` (its families without "rules" and
    "overdrawn"); None when ``stream`` is a folder or already has no rules."""
    size, _, families = stream.partition(":")
    if size not in SIZES:
        return None
    given = [f for f in re.split(r"[+,]", families) if f]
    kept = [f for f in given if f not in RULE_FAMILIES]
    if kept == given:
        return None
    return f"{size}:{'+'.join(kept)}" if kept else size


def _answerable(result: GradeResult) -> str:
    answerable = [q for q in result.scored if q.category != "unknown"]
    return f"{sum(q.right for q in answerable)}/{len(answerable)}"


def highlights(results: Sequence[GradeResult], rules_free: Sequence[GradeResult] = ()) -> str:
    """The few numbers the demo is about, one line per arm; with ``rules_free`` (the same arms
    on the rules-free stream), its score beside the rules stream's."""
    free = {result.label: result for result in rules_free}
    head = "| run | answerable right | rule naming nothing (overdrawn) | 25+ batches back |"
    rule = "| --- | --- | --- | --- |"
    if free:
        head = head.replace("answerable right |", "answerable right, rules stream | rules-free |")
        rule += " --- |"
    lines = [head, rule]
    for result in results:
        far = [q for q in result.scored if q.bucket in FAR_BUCKETS]
        overdrawn = result.by_category.get("overdrawn", (0, 0))
        cells = [_answerable(result)]
        if free:
            cells.append(_answerable(free[result.label]) if result.label in free else "–")
        lines.append(
            f"| {result.label} | {' | '.join(cells)} | "
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


RULES_FREE_FOLDER = "rules_free"
"""Where the demo's rules-free comparison goes, under the demo's folder."""


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("runs/demo"), help="output folder")
    parser.add_argument("--arms", default="", help="comma-separated arms (default: every arm)")
    parser.add_argument("--stream", default=DEMO_STREAM, help="a stream folder or a preset")
    parser.add_argument("--window", type=int, default=DEMO_WINDOW)
    parser.add_argument(
        "--rules-free",
        default="auto",
        help="the rules-free stream headlined beside --stream: auto (the same preset without "
        "the rules and overdrawn families), a preset or folder, or none",
    )
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
    free_stream = rules_free_stream(args.stream) if args.rules_free == "auto" else args.rules_free
    free: Comparison | None = None
    if free_stream not in (None, "none"):
        assert free_stream is not None
        free = run_demo(
            args.out / RULES_FREE_FOLDER,
            arms=parse_arms(args.arms),
            stream=free_stream,
            window=args.window,
            progress=not args.quiet,
        )
    seconds = time.perf_counter() - started
    print(comparison.report)
    print("### What to look for (simulated reader)\n")
    if free is not None:
        print(f"Rules stream `{args.stream}`; rules-free stream `{free_stream}` ", end="")
        print(f"(its report: {free.out / 'report.md'}).\n")
    print(highlights(comparison.results, free.results if free is not None else ()))
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
