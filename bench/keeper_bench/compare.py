"""``keeper-bench compare``: several arms on the same stream, one report.

Each arm runs into its own run folder under the output folder (so a comparison that was
interrupted resumes arm by arm, and ``keeper-bench report`` can re-read any of them), then one
``report.md`` holds the score tables (by question type and by distance), a cost table, and the
paths of two plots: score by distance per arm, and tokens spent per 100K tokens of history.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from keeper_bench.cli import Command
from keeper_bench.costs import CostSummary
from keeper_bench.grader import GradeResult
from keeper_bench.plots import plot_cost_by_segment, plot_score_by_distance
from keeper_bench.report import (
    lost_sets_table,
    reader_label,
    score_table,
)
from keeper_bench.run_options import RunOptions, resolve_stream
from keeper_bench.runner import (
    RunResult,
    add_run_arguments,
    options_from_args,
    run_arm,
)

SCORE_PLOT = "score_by_distance.png"
TOKENS_PLOT = "tokens_per_100k.png"


@dataclass(frozen=True, slots=True)
class Comparison:
    out: Path
    runs: tuple[RunResult, ...]
    report: str
    """The markdown report (also in ``out/report.md``)."""
    plots: tuple[Path, ...]

    @property
    def results(self) -> tuple[GradeResult, ...]:
        return tuple(run.grade for run in self.runs)


def run_folder_name(label: str) -> str:
    """A folder name for a run label ("rag (hybrid)" → "rag_hybrid")."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_") or "run"


def uncached_prompt_tokens(costs: CostSummary) -> tuple[int, bool]:
    """Prompt tokens the server had to read anew, and whether that is an estimate: from the
    server's cache figures when it gave them, else from the prefix shared with the previous call."""
    if costs.cached_reported_calls:
        return costs.prompt_tokens - costs.cached_tokens, False
    return costs.prompt_tokens - costs.prefix_reuse_tokens, True


def comparison_cost_table(rows: Sequence[tuple[str, CostSummary]], *, reader: str) -> str:
    """Model calls, prompt tokens (all and uncached), management tokens, peak window, and the
    wall time each arm spent outside the model (its own cost: the keeper, retrieval, the graph)."""
    lines = [
        f"### Costs ({reader})",
        "",
        "| run | model calls (work + mgmt) | prompt tok | uncached prompt tok | mgmt tok "
        "| peak window | wall s | wall s excl. model |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    estimated = False
    for label, c in rows:
        uncached, guess = uncached_prompt_tokens(c)
        estimated |= guess
        lines.append(
            f"| {label} | {c.calls} ({c.work_calls} + {c.management_calls}) | "
            f"{c.prompt_tokens:,} | {'≈' if guess else ''}{uncached:,} | {c.management_tokens:,} | "
            f"{c.peak_prompt_tokens:,} | {c.wall_seconds:.1f} | "
            f"{max(0.0, c.wall_seconds - c.model_seconds):.1f} |"
        )
    if estimated:
        lines += [
            "",
            "≈: the server reported no cache figures; estimated from the leading messages each "
            "call shared with the one before (a prefix cache could reuse them).",
        ]
    return "\n".join(lines) + "\n"


def compare_runs(
    runs: Sequence[RunOptions], out: Path | str, *, progress: bool = True
) -> Comparison:
    """Run each of ``runs`` (labels must differ) into ``out/<label>`` and write the report."""
    folder = Path(out)
    labels = [options.label or options.arm for options in runs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"run labels must differ, got {labels}; give each run a label")
    folder.mkdir(parents=True, exist_ok=True)
    finished: list[RunResult] = []
    for number, (options, label) in enumerate(zip(runs, labels, strict=True), start=1):
        if progress:
            print(f"[{number}/{len(runs)}] {label}", file=sys.stderr, flush=True)
        run = run_arm(
            replace(options, label=label), folder / run_folder_name(label), progress=progress
        )
        finished.append(run)
    return write_comparison(folder, finished)


def write_comparison(folder: Path, runs: Sequence[RunResult]) -> Comparison:
    results = [run.grade for run in runs]
    costs = [(run.grade.label, run.costs) for run in runs if run.costs is not None]
    reader = reader_label(results)
    plots = [plot_score_by_distance(results, folder / SCORE_PLOT)]
    parts = [score_table(results), lost_sets_table(results)]
    if costs:
        parts.append(comparison_cost_table(costs, reader=reader))
        plots.append(
            plot_cost_by_segment(costs, folder / TOKENS_PLOT, reader=reader, metric="tokens")
        )
    parts.append("Plots: " + ", ".join(str(path) for path in plots) + "\n")
    report = "\n".join(parts)
    (folder / "report.md").write_text(report, encoding="utf-8")
    return Comparison(folder, tuple(runs), report, tuple(plots))


def compare_arms(
    arms: Sequence[str],
    stream: Path | str,
    out: Path | str,
    *,
    progress: bool = True,
    **options: Any,
) -> Comparison:
    """The same run settings (``RunOptions`` fields) for each arm in ``arms``."""
    runs = [RunOptions.create(arm=arm, stream=Path(stream), **options) for arm in arms]
    return compare_runs(runs, out, progress=progress)


def seeds_table(by_seed: Sequence[tuple[int, Comparison]]) -> str:
    """One row per arm: right answers on each seed, and their mean with its 95% interval."""
    from keeper_bench.intervals import t_interval

    labels = list(dict.fromkeys(r.label for _, c in by_seed for r in c.results))
    reader = reader_label([r for _, c in by_seed for r in c.results])
    seeds = [seed for seed, _ in by_seed]
    lines = [
        f"### Right answers over stream seeds {', '.join(map(str, seeds))} ({reader})",
        "",
        "Mean ± the half-width of its 95% Student t interval; two arms whose intervals overlap "
        "are not told apart by these seeds.",
        "",
        "| run | " + " | ".join(f"seed {s}" for s in seeds) + " | mean ± 95% |",
        "| --- |" + " --- |" * (len(seeds) + 1),
    ]
    for label in labels:
        scores = [next((r.right for r in c.results if r.label == label), None) for _, c in by_seed]
        found = [float(s) for s in scores if s is not None]
        cells = ["–" if s is None else str(s) for s in scores]
        interval = t_interval(found).cell() if found else "–"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {interval} |")
    return "\n".join(lines) + "\n"


def compare_seeds(
    seeds: Sequence[int],
    stream: str,
    make_runs: Callable[[Path], list[RunOptions]],
    out: Path,
    *,
    progress: bool = True,
) -> tuple[list[tuple[int, Comparison]], str]:
    """The same comparison on the preset ``stream`` drawn with each seed (``out/seed<S>``), and
    the table of every arm's mean and interval over them (also in ``out/seeds.md``)."""
    by_seed: list[tuple[int, Comparison]] = []
    for seed in seeds:
        folder = out / f"seed{seed}"
        stream_folder = resolve_stream(stream, folder / "stream", seed=seed)
        by_seed.append((seed, compare_runs(make_runs(stream_folder), folder, progress=progress)))
    table = seeds_table(by_seed)
    out.mkdir(parents=True, exist_ok=True)
    (out / "seeds.md").write_text(table, encoding="utf-8")
    return by_seed, table


def parse_arms(text: str) -> list[str]:
    from keeper_bench.arms import ARMS

    arms = [a.strip() for a in text.split(",") if a.strip()] if text else list(ARMS)
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise ValueError(f"unknown arm(s) {', '.join(unknown)}; choose from {', '.join(ARMS)}")
    return arms


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arms", default="", help="comma-separated arms (default: every arm)")
    add_run_arguments(parser)
    parser.add_argument("--out", type=Path, default=Path("runs/compare"), help="output folder")
    parser.add_argument(
        "--seeds",
        default="",
        help="comma-separated stream seeds (3 or more give intervals): the comparison on each, "
        "then every arm's mean and 95%% interval (in OUT/seeds.md)",
    )


def _run(args: argparse.Namespace) -> int:
    arms = parse_arms(args.arms)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if seeds:
        _, table = compare_seeds(
            seeds,
            args.stream,
            lambda stream: [options_from_args(args, arm, stream) for arm in arms],
            args.out,
            progress=not args.quiet,
        )
        print(table)
        print(f"reports: {args.out}/seed*/report.md, {args.out / 'seeds.md'}")
        return 0
    stream = resolve_stream(args.stream, args.out / "stream", seed=args.seed)
    runs = [options_from_args(args, arm, stream) for arm in arms]
    comparison = compare_runs(runs, args.out, progress=not args.quiet)
    print(comparison.report)
    print(f"report: {args.out / 'report.md'}")
    return 0


def register_commands(register: Callable[[Command], None]) -> None:
    register(Command("compare", "run several arms on one stream and report them", _configure, _run))
