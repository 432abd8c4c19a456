"""``keeper-bench sensitivity``: each fault kind alone, at several rates, for the arms compared.

A lead that holds only at one assumed fault mix says little; this table shows which assumption
each lead rests on. Every cell is one arm on one stream (size, seed) with exactly one fault kind
switched on at one rate (the reader's own seed is the stream's), or with none (rate 0, shared by
every kind). The folder it writes::

    OUT/streams/<size>-seed<S>/                     the streams (reused when present)
    OUT/runs/<size>/seed<S>/clean/<arm>/            no faults
    OUT/runs/<size>/seed<S>/<kind>-<rate>/<arm>/    one fault kind at one rate
    OUT/sensitivity.json                            every cell's score
    OUT/README.md                                   one table per size: kinds × arms

``--shard I/N`` runs every N-th cell from the I-th (N processes share the work), and
``--finished-only`` writes the tables from the cells already finished. Every table says who
answered ("simulated reader").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keeper_bench.cli import Command
from keeper_bench.matrix import (
    _stream_lock,
    is_finished,
    parse_shard,
    shard_cells,
)
from keeper_bench.reader.faults import MISREAD_KINDS
from keeper_bench.run_options import RunOptions, resolve_stream
from keeper_bench.runner import run_arm
from keeper_bench.streams import SIZES

FAULT_KINDS: tuple[str, ...] = (
    *MISREAD_KINDS,
    "drop_rules",
    "empty_reply",
    "think_to_limit",
    "repeat_search",
    "circle_searches",
    "rot",
)
"""Every fault the reader can make, one at a time ("rot": context rot at that rate)."""
DEFAULT_ARMS = (
    "notes",
    "notes_retrieval",
    "notes_rewrite",
    "summarize",
    "peer_langchain_summarization_tuned",
    "peer_langmem_summarization_tuned",
)
"""The keeper arms and the three peers that score best without faults (bench/results)."""
DEFAULT_RATES = (0.0, 0.02, 0.05, 0.1)
Cell = tuple[str, int, str, float, str]
"""(size, seed, fault kind, rate, arm); rate 0 is the clean run, kind "none"."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SensitivitySpec:
    """What the table runs: every arm × every kind × every rate, per size and seed."""

    arms: tuple[str, ...] = DEFAULT_ARMS
    kinds: tuple[str, ...] = FAULT_KINDS
    rates: tuple[float, ...] = DEFAULT_RATES
    sizes: tuple[str, ...] = ("240k", "1m")
    seeds: tuple[int, ...] = (1,)
    families: str = "rules+overdrawn+varied"
    window: int = 32_768

    def __post_init__(self) -> None:
        from keeper_bench.arms import ARMS

        bad_arms = [a for a in self.arms if a not in ARMS]
        if bad_arms or not self.arms:
            raise ValueError(
                f"arms: unknown {bad_arms or '(none given)'}; choose from {list(ARMS)}"
            )
        bad_kinds = [k for k in self.kinds if k not in FAULT_KINDS]
        if bad_kinds or not self.kinds:
            raise ValueError(f"kinds: unknown {bad_kinds}; choose from {', '.join(FAULT_KINDS)}")
        if not self.rates or any(not 0 <= r <= 1 for r in self.rates):
            raise ValueError(f"rates must be between 0 and 1, got {self.rates}")
        bad_sizes = [s for s in self.sizes if s not in SIZES]
        if bad_sizes or not self.sizes:
            raise ValueError(f"sizes: unknown {bad_sizes}; choose from {', '.join(SIZES)}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be distinct and at least one, got {self.seeds}")

    def cells(self) -> list[Cell]:
        """The clean cells first, then each kind at each rate above 0; streams outermost."""
        found: list[Cell] = []
        for size in self.sizes:
            for seed in self.seeds:
                if 0.0 in self.rates:
                    found += [(size, seed, "none", 0.0, arm) for arm in self.arms]
                for kind in self.kinds:
                    for rate in self.rates:
                        if rate > 0:
                            found += [(size, seed, kind, rate, arm) for arm in self.arms]
        return found


def cell_options(kind: str, rate: float, seed: int) -> dict[str, Any]:
    """The ``RunOptions`` fields of one cell: that fault alone at that rate (seeded)."""
    if kind == "none" or rate == 0:
        return {"faults": ""}
    if kind == "rot":
        return {"faults": f"seed={seed}", "rot": rate}
    return {"faults": f"{kind}={rate:g},seed={seed}"}


def cell_folder(out: Path, cell: Cell) -> Path:
    size, seed, kind, rate, arm = cell
    mix = "clean" if kind == "none" else f"{kind}-{rate:g}"
    return out / "runs" / size / f"seed{seed}" / mix / arm


@dataclass(frozen=True, slots=True)
class CellResult:
    cell: Cell
    right: int
    asked: int
    by_category: dict[str, tuple[int, int]]
    reader: str


def run_sensitivity(
    spec: SensitivitySpec,
    out: Path | str,
    *,
    progress: bool = True,
    finished_only: bool = False,
    shard: tuple[int, int] | None = None,
) -> tuple[list[CellResult], str]:
    """Run (or read back) every cell of ``spec`` into ``out`` and write the tables; a shard runs
    its part only and writes nothing else."""
    folder = Path(out)
    results: list[CellResult] = []
    missing: list[str] = []
    cells = spec.cells() if shard is None else shard_cells(spec.cells(), shard)
    started = time.perf_counter()
    for number, cell in enumerate(cells, start=1):
        size, seed, kind, rate, arm = cell
        run_dir = cell_folder(folder, cell)
        if finished_only and not is_finished(run_dir):
            missing.append(f"{size} seed {seed} {kind} {rate:g} {arm}")
            continue
        streams = folder / "streams" / f"{size}-seed{seed}"
        with _stream_lock(streams):
            stream = resolve_stream(f"{size}:{spec.families}", streams, seed=seed)
        if progress:
            print(
                f"[{number}/{len(cells)} {time.perf_counter() - started:.0f}s] {size} seed "
                f"{seed} {kind} {rate:g} {arm}",
                file=sys.stderr,
                flush=True,
            )
        options = RunOptions.create(
            arm=arm, stream=stream, window=spec.window, label=arm, **cell_options(kind, rate, seed)
        )
        grade = run_arm(options, run_dir, progress=False).grade
        results.append(CellResult(cell, grade.right, grade.asked, grade.by_category, grade.reader))
    if shard is not None:
        return results, f"shard {shard[0]}/{shard[1]}: {len(results)} cell(s) finished"
    summary = sensitivity_markdown(spec, results, missing)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "README.md").write_text(summary, encoding="utf-8")
    cells_json = [
        {
            "size": r.cell[0],
            "seed": r.cell[1],
            "kind": r.cell[2],
            "rate": r.cell[3],
            "arm": r.cell[4],
            "right": r.right,
            "asked": r.asked,
            "by_category": {k: list(v) for k, v in r.by_category.items()},
        }
        for r in results
    ]
    (folder / "sensitivity.json").write_text(
        json.dumps(
            {"window": spec.window, "families": spec.families, "cells": cells_json}, indent=1
        )
        + "\n",
        encoding="utf-8",
    )
    return results, summary


def _total(results: Sequence[CellResult], **wanted: Any) -> tuple[int, int, int] | None:
    """(right, asked, seeds) summed over the seeds of the cells that match."""
    keys = ("size", "seed", "kind", "rate", "arm")
    chosen = [r for r in results if all(r.cell[keys.index(k)] == v for k, v in wanted.items())]
    if not chosen:
        return None
    return sum(r.right for r in chosen), sum(r.asked for r in chosen), len(chosen)


def sensitivity_markdown(
    spec: SensitivitySpec, results: Sequence[CellResult], missing: Sequence[str] = ()
) -> str:
    """One table per size: a row per fault kind, a column per arm, each cell the right answers
    at each rate above 0 (the first row: no faults)."""
    reader = ", ".join(dict.fromkeys(r.reader for r in results)) or "no runs"
    rates = [r for r in spec.rates if r > 0]
    rate_text = " / ".join(f"{100 * r:g}%" for r in rates)
    seeds = ",".join(map(str, spec.seeds))
    parts = [
        f"## Fault sensitivity ({reader})",
        "",
        f"Each fault kind alone, at {rate_text} of the calls it can strike (rule dropping: of "
        "the rules each memory write holds; context rot: its rate 100K tokens back), for every "
        f"arm on the same streams `{spec.families}` (seeds {seeds}), live window "
        f"{spec.window:,} tokens; the first row has no faults. Each cell: right answers at "
        f"{rate_text}, summed over the seeds.",
        "",
        "Reproduce: `keeper-bench sensitivity --arms "
        + ",".join(spec.arms)
        + f" --kinds {','.join(spec.kinds)} --rates {','.join(f'{r:g}' for r in spec.rates)}"
        f" --sizes {','.join(spec.sizes)} --seeds {seeds} --families {spec.families}"
        f" --window {spec.window}`",
        "",
    ]
    if missing:
        parts += [f"Not run (shown as –): {len(missing)} cell(s), e.g. {missing[0]}.", ""]
    for size in spec.sizes:
        clean = [_total(results, size=size, kind="none", arm=arm) for arm in spec.arms]
        asked = next((c[1] for c in clean if c is not None), None)
        parts += [
            f"### {size}: right answers of {asked if asked is not None else '?'} ({reader})",
            "",
            "| fault | " + " | ".join(spec.arms) + " |",
            "| --- |" + " --- |" * len(spec.arms),
            "| none | " + " | ".join(str(c[0]) if c else "–" for c in clean) + " |",
        ]
        for kind in spec.kinds:
            cells = []
            for arm in spec.arms:
                values = [_total(results, size=size, kind=kind, rate=r, arm=arm) for r in rates]
                cells.append(" / ".join(str(v[0]) if v else "–" for v in values))
            parts.append(f"| {kind} | " + " | ".join(cells) + " |")
        parts.append("")
    return "\n".join(parts) + "\n"


def _split(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arms", default=",".join(DEFAULT_ARMS), help="comma-separated arms")
    parser.add_argument("--kinds", default=",".join(FAULT_KINDS), help="fault kinds, one at a time")
    parser.add_argument(
        "--rates", default=",".join(f"{r:g}" for r in DEFAULT_RATES), help="rates (0: clean)"
    )
    parser.add_argument("--sizes", default="240k,1m", help="comma-separated size presets")
    parser.add_argument("--seeds", default="1", help="comma-separated stream seeds")
    parser.add_argument("--families", default="rules+overdrawn+varied", help="stream families")
    parser.add_argument("--window", type=int, default=32_768, help="live window in tokens")
    parser.add_argument("--out", type=Path, default=Path("runs/sensitivity"), help="output folder")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    parser.add_argument("--shard", default="", help="I/N: run the I-th of N parts of the cells")
    parser.add_argument(
        "--finished-only", action="store_true", help="write the tables from finished cells only"
    )


def _run(args: argparse.Namespace) -> int:
    spec = SensitivitySpec(
        arms=_split(args.arms),
        kinds=_split(args.kinds),
        rates=tuple(float(r) for r in _split(args.rates)),
        sizes=_split(args.sizes),
        seeds=tuple(int(s) for s in _split(args.seeds)),
        families=args.families,
        window=args.window,
    )
    _, summary = run_sensitivity(
        spec,
        args.out,
        progress=not args.quiet,
        finished_only=args.finished_only,
        shard=parse_shard(args.shard) if args.shard else None,
    )
    print(summary)
    return 0


def register_commands(register: Callable[[Command], None]) -> None:
    register(
        Command(
            "sensitivity",
            "each fault kind alone at several rates, for the keeper arms and the best peers",
            _configure,
            _run,
        )
    )
