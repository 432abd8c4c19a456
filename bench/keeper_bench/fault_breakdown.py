"""``keeper-bench fault-breakdown``: the realistic fault mix, and the mix with each fault left out.

The realistic mix (``--faults realistic --rot 0.25``) is one stated bundle; a lead under it can
rest on one of its faults. This table runs every arm clean, under the whole mix, and under the
mix with each fault left out in turn (context rot 0.25 among them), on several stream seeds, and
gives each arm's mean right answers with a 95% interval (``intervals``): the row where an arm's
score rises most names the fault that costs it most. The folder it writes::

    OUT/streams/<size>-seed<S>/                     the streams (reused when present)
    OUT/runs/<size>/seed<S>/<mix>/<arm>/            one run per cell
    OUT/README.md                                   the table (simulated reader)

A cell already finished is read back, so an interrupted breakdown resumes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keeper_bench.cli import Command
from keeper_bench.grader import GradeResult
from keeper_bench.intervals import t_interval
from keeper_bench.reader.faults import MISREAD_KINDS
from keeper_bench.reader.rot import REALISTIC_ROT
from keeper_bench.report import reader_label
from keeper_bench.run_options import RunOptions, resolve_stream
from keeper_bench.runner import run_arm

LEFT_OUT: tuple[str, ...] = (
    *MISREAD_KINDS,
    "drop_rules",
    "empty_reply",
    "think_to_limit",
    "repeat_search",
    "circle_searches",
    "rot",
)
"""Each fault of the realistic mix, left out one at a time ("rot": its context rot)."""
DEFAULT_ARMS = (
    "notes",
    "notes_retrieval",
    "summarize",
    "self_edit_rules",
    "peer_langchain_summarization_tuned",
    "peer_deepagents_tuned",
)


DEFAULT_STREAM = "240k:rules+overdrawn+varied"


def mixes() -> tuple[str, ...]:
    """The rows: clean, the whole realistic mix, then the mix without each fault."""
    return ("clean", "realistic", *(f"without {kind}" for kind in LEFT_OUT))


def mix_options(mix: str, seed: int) -> dict[str, Any]:
    """The ``RunOptions`` fields of one row (the reader's faults seeded by the stream's seed).

    Raises:
        ValueError: a row that is not one of ``mixes()``.
    """
    rot = REALISTIC_ROT.rate
    if mix == "clean":
        return {"faults": "", "rot": 0.0}
    if mix == "realistic":
        return {"faults": f"realistic,seed={seed}", "rot": rot}
    kind = mix.removeprefix("without ")
    if kind not in LEFT_OUT or kind == mix:
        raise ValueError(f"unknown row {mix!r}; rows are {', '.join(mixes())}")
    if kind == "rot":
        return {"faults": f"realistic,seed={seed}", "rot": 0.0}
    return {"faults": f"realistic,{kind}=0,seed={seed}", "rot": rot}


@dataclass(frozen=True, slots=True)
class BreakdownSpec:
    """Every arm × every row × every seed, on one stream preset and window."""

    arms: tuple[str, ...] = DEFAULT_ARMS
    stream: str = DEFAULT_STREAM
    seeds: tuple[int, ...] = (1, 2, 3)
    window: int = 32_768
    rows: tuple[str, ...] = ()

    def chosen_rows(self) -> tuple[str, ...]:
        return self.rows or mixes()


def run_breakdown(
    spec: BreakdownSpec, out: Path | str, *, progress: bool = True
) -> tuple[dict[tuple[str, str, int], GradeResult], str]:
    """Run (or read back) every cell into ``out`` and write ``README.md``; returns the grades by
    (row, arm, seed) and the markdown."""
    folder = Path(out)
    size = spec.stream.partition(":")[0]
    grades: dict[tuple[str, str, int], GradeResult] = {}
    # a row's seeds one after another, so a breakdown stopped early has whole rows
    cells = [(r, a, s) for r in spec.chosen_rows() for a in spec.arms for s in spec.seeds]
    for number, (row, arm, seed) in enumerate(cells, start=1):
        stream = resolve_stream(spec.stream, folder / "streams" / f"{size}-seed{seed}", seed=seed)
        if progress:
            print(f"[{number}/{len(cells)}] seed {seed} {row} {arm}", file=sys.stderr, flush=True)
        options = RunOptions.create(
            arm=arm, stream=stream, window=spec.window, label=arm, **mix_options(row, seed)
        )
        run_dir = folder / "runs" / size / f"seed{seed}" / row.replace(" ", "-") / arm
        grades[(row, arm, seed)] = run_arm(options, run_dir, progress=False).grade
    text = breakdown_markdown(spec, grades)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "README.md").write_text(text, encoding="utf-8")
    return grades, text


def breakdown_markdown(spec: BreakdownSpec, grades: dict[tuple[str, str, int], GradeResult]) -> str:
    """A row per mix, a column per arm: mean right answers over the seeds ± the 95% interval."""
    reader = reader_label(list(grades.values()))
    asked = sorted({g.asked for g in grades.values()})
    seeds = ",".join(map(str, spec.seeds))
    lines = [
        f"## The realistic fault mix, each fault left out ({reader})",
        "",
        f"Stream `{spec.stream}`, seeds {seeds}, window {spec.window:,}; questions asked per "
        f"seed: {', '.join(map(str, asked))}. Each cell: mean right answers over the seeds ± "
        "the half-width of its 95% Student t interval. `realistic` is `--faults realistic "
        f"--rot {REALISTIC_ROT.rate:g}`; each `without` row is that mix with one fault off.",
        "",
        "Reproduce: `keeper-bench fault-breakdown --arms "
        + ",".join(spec.arms)
        + f" --stream {spec.stream} --seeds {seeds} --window {spec.window}`",
        "",
        "| faults | " + " | ".join(spec.arms) + " |",
        "| --- |" + " --- |" * len(spec.arms),
    ]
    for row in spec.chosen_rows():
        cells = []
        for arm in spec.arms:
            scores = [float(g.right) for (r, a, _), g in grades.items() if r == row and a == arm]
            cells.append(t_interval(scores).cell() if scores else "–")
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _split(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arms", default=",".join(DEFAULT_ARMS), help="comma-separated arms")
    parser.add_argument("--stream", default=DEFAULT_STREAM, help="a stream preset")
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated stream seeds")
    parser.add_argument("--window", type=int, default=32_768, help="live window in tokens")
    parser.add_argument("--rows", default="", help="rows to run (default: every row)")
    parser.add_argument("--out", type=Path, default=Path("runs/fault-breakdown"))
    parser.add_argument("--quiet", action="store_true", help="no progress lines")


def _run(args: argparse.Namespace) -> int:
    from keeper_bench.compare import parse_arms

    rows = _split(args.rows)
    for row in rows:
        mix_options(row, 0)  # an unknown row is refused before anything runs
    spec = BreakdownSpec(
        arms=tuple(parse_arms(args.arms)),
        stream=args.stream,
        seeds=tuple(int(s) for s in _split(args.seeds)),
        window=args.window,
        rows=rows,
    )
    _, text = run_breakdown(spec, args.out, progress=not args.quiet)
    print(text)
    return 0


def register_commands(register: Callable[[Command], None]) -> None:
    register(
        Command(
            "fault-breakdown",
            "the realistic fault mix and the mix with each fault left out, over seeds",
            _configure,
            _run,
        )
    )
