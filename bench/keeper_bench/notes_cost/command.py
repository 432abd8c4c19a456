"""``keeper-bench notes-cost``: does the cost per 100K stream tokens stay flat along a long stream?

Runs the notes arm with the simulated reader on the ``harder`` stream at each size (240K, 1M, 10M
tokens by default), each in its own process so its peak memory is its own, and prints per tenth
of the run: prompt tokens, uncached prompt tokens and keeper CPU seconds per 100K stream tokens,
then the final NOTES size and the peak RSS. The table is written to ``--out`` (markdown).
With ``--repeat N`` each size runs N times, one run after the other, each in its own process and
its own folder (``run1`` ... ``runN``); the keeper CPU is then their median per tenth with the
spread beside it (``repeats``), and the figures the simulated reader fixes must agree.
``--arm`` runs another arm the same way: a baseline with no keeper is the control that shows
what the stream and the window alone do to each tenth (its keeper CPU is 0).

- Prompt tokens are the simulated reader's estimate (about four characters a token).
- Uncached prompt tokens: the server reports none, so they are estimated from the leading
  messages each call shared with the one before (what a prefix cache could reuse).
- The run's process freezes its start-up objects after the first step
  (``keeper_middleware.startup``), as a long-running host should and ``keeper-proxy`` does: a
  full collection otherwise walks some 130,000 objects of imported modules inside whichever
  keeper phase sets it off (1.99 s of a 10M run's full collections, 0.31 s frozen).
- Keeper CPU is the process CPU time spent inside ``Keeper.step``/``astep``/``search``, less the
  CPU time of the model calls made from inside them (the reader writing notes): the keeper's own
  work (token counting, planning, checks, the archive transaction, indexing, search). A second
  table splits it by phase (``clock.PHASES``: preparing a step, the note request, the commit,
  indexing, the search, the rest), each second in exactly one phase, so a growth can be traced to
  the work that grows.

Results come from the simulated reader, never a language model; label them so.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from keeper_bench.notes_cost.breakdown import (
    breakdown,
    render_breakdown,
    render_cost_per_cut,
)
from keeper_bench.notes_cost.clock import KeeperClock
from keeper_bench.notes_cost.phases import render_phases
from keeper_bench.notes_cost.repeats import combine
from keeper_bench.notes_cost.tenths import (
    Mark,
    StreamEnd,
    attribute,
    calls_in_first_bytes,
    figures,
    read_calls,
    render_tenths,
)
from keeper_middleware.startup import freeze_startup_objects

if TYPE_CHECKING:
    from keeper_bench.steps import Step

SIZES = ("240k", "1m", "10m")
ARM = "notes"
"""The arm measured unless ``--arm`` names another (a control)."""


def measure_one(
    size: str,
    folder: Path,
    seed: int,
    window: int,
    run_name: str = "run",
    arm: str = ARM,
) -> dict[str, Any]:
    """Run ``arm`` (the notes arm by default) on the harder stream of ``size`` (in ``folder``,
    the run in its ``run_name`` sub-folder) and return the per-tenth figures.

    Another arm is the control the notes arm's figures need: a baseline with no keeper shows
    what the stream and the window alone do to the cost per tenth (the first tenth of a 240K
    stream is shorter than a 32K window, so every arm's first tenth sends smaller requests)."""
    from keeper_bench.run_options import RunOptions
    from keeper_bench.runner import run_arm
    from keeper_bench.streams import (
        generate_stream,
        history_tokens_by_item,
        preset_spec,
    )

    stream = folder / "stream"
    if not (stream / "spec.json").exists():
        generate_stream(preset_spec(size, seed=seed, families=frozenset({"harder"})), stream)
    options = RunOptions.create(arm=arm, stream=stream, model="sim", window=window)
    clock = KeeperClock()
    marks: list[Mark] = []  # the stream tokens and keeper CPU so far, at the end of each step
    run_dir = folder / run_name
    calls_path = run_dir / "calls.jsonl"
    end = {"tokens": 0, "bytes": 0}  # the last step before the final questions
    frozen = {"objects": 0}

    def on_step(step: Step, _values: Mapping[str, Any]) -> None:
        if not marks:
            # start-up is over once the first step has run (every module imported, the graph
            # built): the host freezes it, as keeper-proxy does before it serves, so a full
            # collection inside a keeper phase walks the run's objects, not the imported modules
            frozen["objects"] = freeze_startup_objects()
        after = step.question is not None and bool(step.question.get("final"))
        marks.append(
            Mark(
                history_tokens=step.history_tokens,
                keeper_cpu_s=clock.keeper,
                after_stream=after,
                phases=clock.keeper_phases(),
            )
        )
        if not after:
            end["tokens"] = step.history_tokens
            end["bytes"] = calls_path.stat().st_size if calls_path.exists() else 0

    started = time.perf_counter()
    with clock.installed():
        result = run_arm(options, run_dir, progress=False, on_step=on_step)
    seconds = time.perf_counter() - started
    stream_end = StreamEnd(
        tokens=end["tokens"], calls=calls_in_first_bytes(calls_path, end["bytes"])
    )
    stream_end.save(run_dir)
    by_item = history_tokens_by_item(stream)
    counters_path = run_dir / "keeper_counters.json"
    kept = counters_path.exists()  # an arm with no keeper leaves no counters and no archive
    counters = json.loads(counters_path.read_text(encoding="utf-8")) if kept else {}
    return {
        "size": size,
        "arm": arm,
        "keeper": kept,
        "window": window,
        "seconds": round(seconds, 1),
        "score": f"{result.grade.right}/{result.grade.asked}",
        **figures(attribute(read_calls(run_dir), by_item, marks, stream_end)),
        "breakdown": breakdown(run_dir, by_item, stream_end) if kept else [],
        "notes_tokens": counters.get("notes_tokens", 0),
        "notes_entries": _final_entries(run_dir) if kept else 0,
        "notes_entries_moved": counters.get("notes_entries_moved", 0),
        "cuts": counters.get("cuts", 0),
        "searches": counters.get("searches", 0),
        "frozen_objects": frozen["objects"],
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def _final_entries(run_dir: Path) -> int:
    last = ""
    with (run_dir / "notes.jsonl").open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                last = line
    text = json.loads(last)["text"] if last else ""
    return sum(1 for line in text.splitlines() if line.startswith("- "))


# -- the table ----------------------------------------------------------------------------------
def _header(result: Mapping[str, Any]) -> str:
    heading = f"### {result['size']} tokens, window {result['window']:,}"
    if result.get("arm", ARM) != ARM:
        heading += f", arm {result['arm']}"
    if "repeat" not in result:
        return f"{heading} ({result['seconds']} s, score {result['score']}, simulated reader)"
    seconds = ", ".join(f"{value}" for value in result["runs_seconds"])
    return (
        f"{heading} ({result['repeat']} runs, one after the other: {seconds} s; "
        f"score {result['score']} in each, simulated reader)"
    )


def _peak(result: Mapping[str, Any]) -> str:
    if "repeat" not in result:
        return f"Peak RSS of the run's process: {result['peak_rss_mb']:.0f} MB."
    each = ", ".join(f"{value:.0f}" for value in result["runs_peak_rss_mb"])
    return (
        f"Peak RSS of a run's process: {result['peak_rss_mb']:.0f} MB "
        f"(the largest of the {result['repeat']} runs: {each} MB)."
    )


def render(results: Sequence[dict[str, Any]]) -> str:
    arms = list(dict.fromkeys(str(result.get("arm", ARM)) for result in results)) or [ARM]
    named = "Notes arm" if arms == [ARM] else "Arm " + ", ".join(arms)
    lines = [
        f"{named} on the harder stream, cost per 100K stream tokens in each tenth of the run "
        "(simulated reader)",
        "",
    ]
    for result in results:
        lines += [_header(result), "", *render_tenths(result)]
        if "repeat" in result:
            lines += [
                "",
                f"Keeper CPU: the median of {result['repeat']} runs of this size, each in its own "
                "process, with the lowest and highest run beside it; last vs first and tenths "
                "2–9 from the medians, each run's own last vs first beside it. Token figures, "
                "score, NOTES, cuts, searches and what each tenth is made of were the same in "
                "every run (checked).",
            ]
        if not result.get("keeper", True):
            lines += [
                "",
                f"The {result['arm']} arm runs no keeper: its keeper CPU is 0 and it has no NOTES. "
                f"{_peak(result)}",
                "",
            ]
            continue
        lines += [
            "",
            f"Final NOTES: {result['notes_tokens']:,} tokens, {result['notes_entries']:,} entries "
            f"({result['notes_entries_moved']:,} entries moved to the archive over the run); "
            f"{result['cuts']:,} cuts, {result['searches']:,} archive searches. {_peak(result)}",
            "",
        ]
        per_cut = render_cost_per_cut(result)
        if per_cut:
            lines += [per_cut, ""]
        if result.get("phases"):
            lines += [*render_phases(result), ""]
        if result.get("breakdown"):
            lines += ["What each tenth is made of:", "", render_breakdown(result["breakdown"]), ""]
    lines.append(
        "≈: the simulated reader reports no cache figures; uncached tokens are estimated from the "
        "leading messages each call shared with the one before."
    )
    return "\n".join(lines) + "\n"


def _repeat(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"--repeat is how many runs of each size, a whole number of 1 or more; got {text!r}"
        )
    return value


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default=",".join(SIZES), help="comma-separated stream sizes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--window", type=int, default=32_768)
    parser.add_argument(
        "--arm",
        default=ARM,
        help="the arm to run (default notes); a baseline such as window_drop or summarize is "
        "the control that shows what the stream and the window alone do to each tenth",
    )
    parser.add_argument("--work", type=Path, default=None, help="folder for streams and runs")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here")
    parser.add_argument(
        "--repeat",
        type=_repeat,
        default=1,
        metavar="N",
        help="run each size N times, one run after the other, and report the median keeper CPU "
        "per tenth with the spread of the runs (default 1)",
    )
    parser.add_argument(
        "--explain",
        type=Path,
        default=None,
        help="print what each tenth is made of for the finished runs in this --work folder",
    )
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--run-name", default="run", help=argparse.SUPPRESS)


def run_names(repeat: int) -> list[str]:
    """The run sub-folders of one size: ``run`` for a single run, ``run1`` ... ``runN`` else."""
    return ["run"] if repeat == 1 else [f"run{number}" for number in range(1, repeat + 1)]


def _finished_runs(folder: Path) -> list[Path]:
    found = [path for path in folder.glob("run*") if path.is_dir()]
    runs = [path for path in found if path.name == "run" or path.name[3:].isdigit()]
    return sorted(runs, key=lambda path: int(path.name[3:] or 0))


def _measure_in_child(size: str, folder: Path, run_name: str, args: argparse.Namespace) -> Any:
    command = [
        sys.executable,
        "-m",
        "keeper_bench.notes_cost.command",
        "--one",
        size,
        "--work",
        str(folder),
        "--run-name",
        run_name,
        "--seed",
        str(args.seed),
        "--window",
        str(args.window),
        "--arm",
        args.arm,
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _run(args: argparse.Namespace) -> int:
    if args.explain is not None:
        from keeper_bench.streams import history_tokens_by_item

        for folder in sorted(args.explain.glob("harder-*-seed*")):
            by_item = history_tokens_by_item(folder / "stream")
            for run in _finished_runs(folder):
                rows = breakdown(run, by_item, StreamEnd.load(run))
                name = folder.name if run.name == "run" else f"{folder.name}/{run.name}"
                print(f"### {name}\n\n{render_breakdown(rows)}\n")
        return 0
    if args.one is not None:  # the child process: one run of one size, figures as JSON on stdout
        result = measure_one(args.one, args.work, args.seed, args.window, args.run_name, args.arm)
        print(json.dumps(result))
        return 0
    results = []
    names = run_names(args.repeat)
    with contextlib.ExitStack() as stack:
        work = args.work or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        for size in (s.strip() for s in args.sizes.split(",") if s.strip()):
            folder = work / f"harder-{size}-seed{args.seed}"
            if _finished_runs(folder):
                raise ValueError(f"{folder} already holds runs; give an empty --work folder")
            folder.mkdir(parents=True, exist_ok=True)
            runs = []
            for name in names:  # the runs of one size back to back; sizes are not interleaved
                runs.append(_measure_in_child(size, folder, name, args))
                if len(names) > 1:
                    text = json.dumps(runs[-1]) + "\n"
                    (folder / name / "result.json").write_text(text, encoding="utf-8")
            results.append(combine(size, runs))
            (folder / "result.json").write_text(json.dumps(results[-1]) + "\n", encoding="utf-8")
            print(render(results[-1:]), flush=True)
    text = render(results)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
    return 0


def register_commands(register: Callable[[Any], None]) -> None:
    """Adds ``keeper-bench notes-cost``."""
    from keeper_bench.cli import Command

    register(
        Command(
            "notes-cost",
            "cost per 100K stream tokens in each tenth of long notes runs (simulated reader)",
            _configure,
            _run,
        )
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    _configure(parser)
    return _run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
