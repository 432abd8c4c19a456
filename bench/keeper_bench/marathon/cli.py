"""``keeper-bench marathon`` and ``keeper-bench marathon-fetch``."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from keeper_bench.marathon.run import (
    WAYS,
    MarathonOptions,
    WayResult,
    prepare_project,
    run_marathon,
)
from keeper_bench.marathon.scripted import SCRIPTED_AGENT
from keeper_bench.marathon.source import SourceMissingError, fetch_sdist


def summary_table(results: Sequence[WayResult]) -> str:
    """One row per way: outcome, then cost."""
    lines = [
        "| way | model | fixed | clean | regressions | audit | notices kept | model calls | "
        "note calls | prompt tokens | largest output (chars) | NOTES versions | wall (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        grade = result.grade
        defects = len(grade.tickets)
        audit = "—" if grade.audit_right is None else ("right" if grade.audit_right else "wrong")
        kept = grade.notices_kept
        notices = f"{sum(kept.values())}/{len(kept)}" if kept else "—"
        lines.append(
            f"| {result.way} | {result.model} | {grade.fixed}/{defects} | {grade.clean}/{defects} | "
            f"{len(grade.regressions)} | {audit} | {notices} | {result.model_calls} | "
            f"{result.management_calls} | {result.prompt_tokens:,} | "
            f"{result.largest_output_chars:,} | {result.notes_versions} | {result.wall_seconds:.0f} |"
        )
    return "\n".join(lines)


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ways", default=",".join(WAYS), help="comma-separated: " + ", ".join(WAYS)
    )
    parser.add_argument(
        "--model",
        default="scripted",
        help="scripted (a replay of correct fixes: plumbing, not a score) or openai:URL[:MODEL]",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--defects", type=int, default=40)
    parser.add_argument("--window", type=int, default=32_768)
    parser.add_argument("--no-audit", action="store_true", help="leave out the audit ticket")
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--out", type=Path, default=Path("runs/marathon"))


def _run(args: argparse.Namespace) -> int:
    results = []
    try:
        prepared = prepare_project(args.out / "planted", seed=args.seed, defects=args.defects)
        for way in (w.strip() for w in args.ways.split(",") if w.strip()):
            options = MarathonOptions(
                way=way,
                out=args.out / way,
                model=args.model,
                seed=args.seed,
                defects=args.defects,
                window=args.window,
                audit=not args.no_audit,
                max_tokens=args.max_tokens,
                timeout=args.timeout,
            )
            results.append(run_marathon(options, prepared))
            print(f"{way}: done", flush=True)
    except (SourceMissingError, ValueError) as error:
        print(f"keeper-bench marathon: {error}")
        return 2
    table = summary_table(results)
    label = (
        f"{SCRIPTED_AGENT}: a replay of correct fixes; it measures the harness and the cost of each "
        "way at real message sizes, not a model's skill"
        if args.model == "scripted"
        else f"model {args.model}"
    )
    text = (
        f"# Repair marathon (seed {args.seed}, {args.defects} defects, window {args.window})\n\n"
        f"{label}\n\n{table}\n"
    )
    (args.out / "summary.md").write_text(text)
    (args.out / "summary.json").write_text(json.dumps([r.summary() for r in results], indent=1))
    print(text)
    return 0


def _configure_fetch(parser: argparse.ArgumentParser) -> None:
    del parser


def _run_fetch(args: argparse.Namespace) -> int:
    del args
    print(f"marathon source: {fetch_sdist()}")
    return 0


def register_commands(register: Callable[[Any], None]) -> None:
    from keeper_bench.cli import Command

    register(
        Command("marathon", "the repair marathon: tickets on a real code base", _configure, _run)
    )
    register(
        Command(
            "marathon-fetch",
            "download the marathon's pinned source once (an install-time step)",
            _configure_fetch,
            _run_fetch,
        )
    )
