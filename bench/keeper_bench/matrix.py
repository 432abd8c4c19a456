"""``keeper-bench matrix``: every arm and peer setting × fault mix × seed × size, one summary.

A comparison a sceptical reader can check: the same streams (one per size and seed), the same
reader for every arm, each arm run with no faults and with a stated realistic mix, every peer at
its defaults and tuned, and several seeds whose spread is shown. The folder it writes::

    OUT/streams/<size>-seed<S>/           the streams (reused when present)
    OUT/runs/<size>/<faults>/seed<S>/<arm>/  one run folder per cell (resumes when interrupted)
    OUT/matrix.json                       every cell's score, costs and audit
    OUT/README.md                         the summary: headline, scores, costs, audits, plots
    OUT/score_by_distance-<size>-<faults>.png, OUT/tokens_per_100k-<size>.png

Every table says who answered ("simulated reader" or the model).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from keeper_bench.cli import Command
from keeper_bench.grader import GradeResult
from keeper_bench.matrix_report import (
    FAULT_LABELS,
    MatrixRun,
    audit_table,
    cost_table,
    headline_table,
    score_tables,
)
from keeper_bench.plots import plot_cost_by_segment, plot_score_by_distance
from keeper_bench.reader.faults import FAULT_PRESETS, ReaderFaults
from keeper_bench.reader.rot import REALISTIC_ROT
from keeper_bench.report import reader_label
from keeper_bench.run_folder import PROGRESS_FILE
from keeper_bench.run_options import RunOptions, resolve_stream
from keeper_bench.runner import run_arm
from keeper_bench.streams import SIZES

REALISTIC_FAULTS = ",".join(
    f"{f.name}={getattr(FAULT_PRESETS['realistic'], f.name)}"
    for f in fields(ReaderFaults)
    if f.name != "seed" and getattr(FAULT_PRESETS["realistic"], f.name)
)
"""The reader's stated realistic mix (not a measurement), as --faults rates; its seed is the
stream's."""
FAULT_MIXES = {"none": "", "realistic": REALISTIC_FAULTS}
CellT = TypeVar("CellT")


@dataclass(frozen=True, slots=True, kw_only=True)
class MatrixSpec:
    """What the matrix runs. Every combination of the tuples is one run."""

    arms: tuple[str, ...]
    sizes: tuple[str, ...] = ("240k",)
    seeds: tuple[int, ...] = (1, 2, 3)
    faults: tuple[str, ...] = ("none", "realistic")
    families: str = "rules+overdrawn"
    window: int = 32_768
    model: str = "sim"
    rot: float = 0.0
    """Context rot of the simulated reader in the realistic mix (a long context is not free);
    0 leaves it out. The no-faults mix never has any."""
    extra: dict[str, Any] = field(default_factory=dict)
    """More ``RunOptions`` fields, the same for every run (e.g. ``retriever``)."""

    def __post_init__(self) -> None:
        from keeper_bench.arms import ARMS

        unknown = [a for a in self.arms if a not in ARMS]
        if unknown or not self.arms:
            raise ValueError(
                f"arms: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(ARMS)}"
            )
        bad_sizes = [s for s in self.sizes if s not in SIZES]
        if bad_sizes or not self.sizes:
            raise ValueError(f"sizes: unknown {bad_sizes}; choose from {', '.join(SIZES)}")
        bad_mixes = [f for f in self.faults if f not in FAULT_MIXES]
        if bad_mixes or not self.faults:
            raise ValueError(f"faults: unknown {bad_mixes}; choose from {', '.join(FAULT_MIXES)}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be distinct and at least one, got {self.seeds}")
        if self.model != "sim" and (self.faults != ("none",) or self.rot):
            raise ValueError(
                "fault mixes and rot apply to the simulated reader only; use --faults none"
            )
        if not 0 <= self.rot <= 1:
            raise ValueError(f"rot must be a rate between 0 and 1, got {self.rot}")

    def cells(self) -> list[tuple[str, int, str, str]]:
        """(size, seed, faults, arm), streams outermost so each stream is generated once."""
        return [
            (size, seed, mix, arm)
            for size in self.sizes
            for seed in self.seeds
            for mix in self.faults
            for arm in self.arms
        ]


def faults_text(mix: str, seed: int) -> str:
    rates = FAULT_MIXES[mix]
    return f"{rates},seed={seed}" if rates else ""


def mix_options(spec: MatrixSpec, mix: str, seed: int) -> dict[str, Any]:
    """The ``RunOptions`` fields of one fault mix: its fault rates with the stream's seed, and
    the realistic mix's context rot when the matrix has one."""
    options: dict[str, Any] = {"faults": faults_text(mix, seed)}
    if mix == "realistic" and spec.rot:
        options["rot"] = spec.rot
    return options


def _reasks(run_dir: Path) -> int | None:
    path = run_dir / "keeper_counters.json"
    return int(json.loads(path.read_text())["reasks"]) if path.exists() else None


def is_finished(run_dir: Path) -> bool:
    """Whether a cell's run went to the end of its stream."""
    path = run_dir / PROGRESS_FILE
    return path.exists() and bool(json.loads(path.read_text()).get("finished"))


def parse_shard(text: str) -> tuple[int, int]:
    """``I/N`` (the I-th of N processes, from 1) as (I, N); an error names the fix."""
    first, _, second = text.partition("/")
    try:
        index, count = int(first), int(second)
    except ValueError:
        index, count = 0, 0
    if not 1 <= index <= count:
        raise ValueError(f"shard must be I/N with 1 <= I <= N (e.g. 2/3), got {text!r}")
    return index, count


def shard_cells(cells: Sequence[CellT], shard: tuple[int, int]) -> list[CellT]:
    """The cells the ``shard`` = (I, N) process runs: every N-th cell from the I-th, so the N
    processes share each stream's arms (and its slow and quick cells) evenly."""
    index, count = shard
    return [cell for number, cell in enumerate(cells) if number % count == index - 1]


@contextlib.contextmanager
def _stream_lock(folder: Path) -> Iterator[None]:
    """Held while a stream is generated or checked, so processes sharing the matrix's folder
    never read a stream another one is still writing."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_matrix(
    spec: MatrixSpec,
    out: Path | str,
    *,
    progress: bool = True,
    finished_only: bool = False,
    shard: tuple[int, int] | None = None,
) -> tuple[list[MatrixRun], str]:
    """Run every cell of ``spec`` into ``out`` (finished cells are read back, not run again)
    and write the summary; returns the runs and the summary's markdown. ``finished_only``
    summarises the cells already finished and runs nothing (the summary lists the others).
    ``shard`` = (I, N) runs only the I-th of N interleaved parts of the cells, so N processes
    can share the work; each writes the summary of its part, and a last call with
    ``finished_only`` writes the whole one."""
    folder = Path(out)
    runs: list[MatrixRun] = []
    missing: list[str] = []
    cells = spec.cells() if shard is None else shard_cells(spec.cells(), shard)
    started = time.perf_counter()
    for number, (size, seed, mix, arm) in enumerate(cells, start=1):
        run_dir = folder / "runs" / size / mix / f"seed{seed}" / arm
        if finished_only and not is_finished(run_dir):
            missing.append(f"{size} seed {seed} {mix} {arm}")
            continue
        streams = folder / "streams" / f"{size}-seed{seed}"
        with _stream_lock(streams):
            stream = resolve_stream(f"{size}:{spec.families}", streams, seed=seed)
        if progress:
            elapsed = time.perf_counter() - started
            print(
                f"[{number}/{len(cells)} {elapsed:.0f}s] {size} seed {seed} {mix} {arm}",
                file=sys.stderr,
                flush=True,
            )
        options = RunOptions.create(
            arm=arm,
            stream=stream,
            window=spec.window,
            model=spec.model,
            label=arm,
            **mix_options(spec, mix, seed),
            **spec.extra,
        )
        result = run_arm(options, run_dir, progress=False)
        runs.append(
            MatrixRun(
                size, mix, seed, arm, result.grade, result.costs, result.audit, _reasks(run_dir)
            )
        )
    if shard is not None:  # a part: the whole summary is written by a --finished-only call
        return runs, f"shard {shard[0]}/{shard[1]}: {len(runs)} cell(s) finished"
    return runs, write_matrix(folder, spec, runs, missing=missing)


def _plots(folder: Path, spec: MatrixSpec, runs: Sequence[MatrixRun], reader: str) -> list[Path]:
    plots: list[Path] = []
    for size in spec.sizes:
        for mix in spec.faults:
            grades: list[GradeResult] = [
                r.grade for r in runs if r.size == size and r.faults == mix
            ]
            if grades:
                plots.append(
                    plot_score_by_distance(grades, folder / f"score_by_distance-{size}-{mix}.png")
                )
        costs = [
            (r.arm, r.costs)
            for r in runs
            if r.size == size and r.faults == spec.faults[0] and r.costs is not None
        ]
        if costs:
            path = folder / f"tokens_per_100k-{size}.png"
            plots.append(plot_cost_by_segment(costs, path, reader=reader, metric="tokens"))
    return plots


def summary_markdown(
    spec: MatrixSpec,
    runs: Sequence[MatrixRun],
    plots: Sequence[Path],
    missing: Sequence[str] = (),
) -> str:
    """The README-ready summary: settings, then per size the headline, scores, costs, audit."""
    reader = reader_label([r.grade for r in runs])
    seeds = ", ".join(map(str, spec.seeds))
    parts = [
        f"## Comparison matrix ({reader})",
        "",
        f"Streams `{spec.families}` at {', '.join(spec.sizes)}, seeds {seeds}; live window "
        f"{spec.window:,} tokens; every arm answered by the same {reader}. Fault mixes: "
        + "; ".join(f"{FAULT_LABELS.get(m, m)} (`{FAULT_MIXES[m] or 'none'}`)" for m in spec.faults)
        + ", the same mix for every call of every arm (work, notes, summaries)"
        + (f"; the realistic mix adds context rot {spec.rot:g}." if spec.rot else "."),
        "",
        "Reproduce: `keeper-bench matrix --arms "
        + ",".join(spec.arms)
        + f" --sizes {','.join(spec.sizes)} --seeds {','.join(map(str, spec.seeds))} "
        f"--faults {','.join(spec.faults)} --window {spec.window} --families {spec.families}"
        + (f" --rot {spec.rot:g}" if spec.rot else "")
        + "`",
        "",
    ]
    if missing:
        parts += [f"Not run (left out of every table): {'; '.join(missing)}.", ""]
    for size in spec.sizes:
        parts.append(headline_table(runs, size, reader))
        for mix in spec.faults:
            parts.append(score_tables(runs, size, mix, reader))
        for mix in spec.faults:
            parts.append(cost_table(runs, size, mix, reader))
        parts.append(audit_table(runs, size, reader))
    if plots:
        parts.append("Plots: " + ", ".join(f"[{p.name}]({p.name})" for p in plots) + "\n")
    return "\n".join(parts)


def write_matrix(
    folder: Path, spec: MatrixSpec, runs: Sequence[MatrixRun], *, missing: Sequence[str] = ()
) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    reader = reader_label([r.grade for r in runs])
    plots = _plots(folder, spec, runs, reader)
    summary = summary_markdown(spec, runs, plots, missing)
    (folder / "README.md").write_text(summary, encoding="utf-8")
    cells = [
        {
            "size": r.size,
            "faults": r.faults,
            "seed": r.seed,
            "arm": r.arm,
            "right": r.grade.right,
            "asked": r.grade.asked,
            "by_category": {k: list(v) for k, v in r.grade.by_category.items()},
            "by_bucket": {k: list(v) for k, v in r.grade.by_bucket.items()},
            "costs": r.costs.to_json() if r.costs is not None else None,
            "audit": {k: v for k, v in (r.audit or {}).items() if k != "wrong_lines"} or None,
            "reasks": r.reasks,
        }
        for r in runs
    ]
    matrix = {"reader": reader, "window": spec.window, "families": spec.families, "runs": cells}
    (folder / "matrix.json").write_text(json.dumps(matrix, indent=1) + "\n", encoding="utf-8")
    return summary


def _split(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arms", default="", help="comma-separated arms (default: every arm)")
    parser.add_argument("--sizes", default="240k", help="comma-separated size presets")
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated stream seeds")
    parser.add_argument("--faults", default="none,realistic", help="fault mixes: none, realistic")
    parser.add_argument("--families", default="rules+overdrawn", help="stream families")
    parser.add_argument("--window", type=int, default=32_768, help="live window in tokens")
    parser.add_argument("--model", default="sim", help="sim or openai:URL[:MODEL]")
    parser.add_argument(
        "--rot",
        type=float,
        default=0.0,
        help=f"context rot in the realistic mix (0: none; {REALISTIC_ROT.rate} the stated "
        "realistic setting)",
    )
    parser.add_argument("--out", type=Path, default=Path("runs/matrix"), help="output folder")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    parser.add_argument(
        "--shard",
        default="",
        help="I/N: run only the I-th of N interleaved parts of the cells (N processes share "
        "the work; then run once more with --finished-only for the whole summary)",
    )
    parser.add_argument(
        "--finished-only",
        action="store_true",
        help="summarise the finished cells only; run nothing (the summary lists the others)",
    )


def _run(args: argparse.Namespace) -> int:
    from keeper_bench.arms import ARMS

    spec = MatrixSpec(
        arms=_split(args.arms) or tuple(ARMS),
        sizes=_split(args.sizes),
        seeds=tuple(int(s) for s in _split(args.seeds)),
        faults=_split(args.faults),
        families=args.families,
        window=args.window,
        model=args.model,
        rot=args.rot,
    )
    _, summary = run_matrix(
        spec,
        args.out,
        progress=not args.quiet,
        finished_only=args.finished_only,
        shard=parse_shard(args.shard) if args.shard else None,
    )
    print(summary)
    if not args.shard:
        print(f"summary: {args.out / 'README.md'}")
    return 0


def register_commands(register: Callable[[Command], None]) -> None:
    register(
        Command(
            "matrix",
            "every arm and peer setting × fault mix × seed × size, with a README-ready summary",
            _configure,
            _run,
        )
    )
