"""``keeper-bench``: generate streams, grade runs, audit notes, write reports.

Subcommands live in a small registry (``register``); a module listed in ``COMMAND_MODULES`` that
defines ``register_commands(register)`` adds its own (run, compare, demo, ...) without this file
knowing them. Built-in: ``generate``, ``grade``, ``audit``, ``report``.

A run folder (RUN_DIR) holds:

- ``run.json``: ``{"stream": "<stream folder, absolute or relative to RUN_DIR>", "reader":
  "simulated reader" | "<model name>", "label": "<arm or run name>"}`` (more keys are allowed);
- ``answers.jsonl``: one record per questions message answered, ``{"after_item": N, "final":
  false, "reply": "<the reply text, with its N. answer lines>"}``;
- ``notes.jsonl`` (for ``audit``): one record per saved NOTES version, ``{"version": V,
  "first_item": A, "last_item": B, "text": "<the rendered NOTES message>"}``; or
  ``summaries.jsonl``: one record per version of a summarising arm's memory (each summary the
  work calls carried, an empty one included), the same keys plus ``"kind": "summary"`` (B: the
  last item the summary calls had read);
- ``calls.jsonl`` (optional, for costs): one ``CallRecord`` per model call (see ``costs.py``).

``grade`` writes ``grade.json``, ``audit`` writes ``audit.json`` into the run folder; both print
a markdown table. Run it as ``keeper-bench ...`` or ``python -m keeper_bench.cli ...``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keeper_bench.audit import MEMORY_FILES, AuditResult, MemoryVersion, audit_memory
from keeper_bench.costs import CallRecord, CostSummary, summarize_costs
from keeper_bench.grader import GradeResult, grade
from keeper_bench.ledger import Ledger
from keeper_bench.plots import plot_cost_by_segment, plot_score_by_distance
from keeper_bench.report import (
    cost_table,
    lost_sets_table,
    score_table,
)
from keeper_bench.streams import (
    FAMILIES,
    SIZES,
    StreamSpec,
    generate_stream,
    history_tokens_by_item,
    preset_spec,
    question_sets,
)

COMMAND_MODULES = (
    "keeper_bench.runner",
    "keeper_bench.compare",
    "keeper_bench.matrix",
    "keeper_bench.sensitivity",
    "keeper_bench.fault_breakdown",
    "keeper_bench.demo",
    "keeper_bench.step_cost",
    "keeper_bench.bulk_import",
    "keeper_bench.index_cost",
    "keeper_bench.locomo.cli",
    "keeper_bench.notes_cost.command",
    "keeper_bench.moved_cost",
    "keeper_bench.branches_cost",
    "keeper_bench.state_size",
    "keeper_bench.marathon.cli",
    "keeper_bench.proxy.overhead",
)


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS: dict[str, Command] = {}


def register(command: Command) -> None:
    if command.name in COMMANDS:
        raise ValueError(f"a keeper-bench command named {command.name!r} is already registered")
    COMMANDS[command.name] = command


_LOADED: set[str] = set()


def _load_command_modules() -> None:
    for module in COMMAND_MODULES:
        if module in _LOADED:
            continue
        _LOADED.add(module)
        try:
            loaded = importlib.import_module(module)
        except ModuleNotFoundError as error:
            if error.name == module:
                continue  # that part of the benchmark is not installed here
            raise
        hook = getattr(loaded, "register_commands", None)
        if callable(hook):
            hook(register)


# -- run folders --------------------------------------------------------------------------------
def _jsonl(path: Path) -> Iterator[dict[str, Any]]:
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing (see `keeper-bench --help` for the run folder layout)"
        )
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as error:
                    raise ValueError(f"{path} line {number} is not JSON: {error}") from error


def read_run(run_dir: Path) -> tuple[dict[str, Any], Path]:
    """The run's run.json and its stream folder."""
    path = run_dir / "run.json"
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing: a run folder needs run.json naming its stream and reader"
        )
    run = json.loads(path.read_text(encoding="utf-8"))
    if "stream" not in run:
        raise ValueError(f"{path} must name the stream folder under the key 'stream'")
    stream = Path(run["stream"])
    return run, stream if stream.is_absolute() else run_dir / stream


def grade_run(run_dir: Path) -> GradeResult:
    run, stream = read_run(run_dir)
    replies: dict[tuple[int, bool], str] = {}
    for record in _jsonl(run_dir / "answers.jsonl"):
        replies.setdefault(
            (int(record["after_item"]), bool(record.get("final", False))), str(record["reply"])
        )
    return grade(
        question_sets(stream),
        replies,
        reader=str(run.get("reader", "")),
        label=str(run.get("label", run_dir.name)),
    )


def costs_of_run(run_dir: Path) -> CostSummary | None:
    path = run_dir / "calls.jsonl"
    if not path.exists():
        return None
    _, stream = read_run(run_dir)
    # read one call at a time: a long run's calls do not fit in memory as objects
    return summarize_costs(
        (CallRecord.from_json(r) for r in _jsonl(path)), history_tokens_by_item(stream)
    )


# -- built-in commands --------------------------------------------------------------------------
def _configure_generate(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--families", default="base", help=f"comma-separated, from {', '.join(sorted(FAMILIES))}"
    )
    parser.add_argument(
        "--size", default="small", choices=sorted(SIZES), help="a named size preset"
    )
    parser.add_argument("--tokens", type=int, help="target size in tokens (overrides the preset's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="folder to write the stream into")


def _run_generate(args: argparse.Namespace) -> int:
    families = frozenset(f.strip() for f in args.families.split(",") if f.strip())
    spec = preset_spec(args.size, seed=args.seed, families=families)
    if args.tokens is not None:
        spec = StreamSpec.from_json({**spec.to_json(), "target_tokens": args.tokens})
    started = time.perf_counter()
    info = generate_stream(spec, args.out)
    seconds = time.perf_counter() - started
    print(json.dumps({**info.to_json(), "seconds": round(seconds, 2)}, indent=2))
    return 0


def _configure_run_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path)


def _run_grade(args: argparse.Namespace) -> int:
    result = grade_run(args.run_dir)
    (args.run_dir / "grade.json").write_text(
        json.dumps(result.to_json(), indent=1) + "\n", encoding="utf-8"
    )
    print(result.markdown())
    return 0


def audit_run(run_dir: Path) -> AuditResult | None:
    """The audit of the memory a run kept (NOTES, else summaries); None when it kept neither."""
    _, stream = read_run(run_dir)
    for kind, name in MEMORY_FILES.items():
        path = run_dir / name
        if path.exists():
            versions = (MemoryVersion.from_json({"kind": kind, **r}) for r in _jsonl(path))
            return audit_memory(versions, Ledger.load(stream))
    return None


def _run_audit(args: argparse.Namespace) -> int:
    run, _ = read_run(args.run_dir)
    result = audit_run(args.run_dir)
    if result is None:
        names = " or ".join(MEMORY_FILES.values())
        raise FileNotFoundError(f"{args.run_dir} holds no {names}: this arm kept no memory")
    (args.run_dir / "audit.json").write_text(
        json.dumps(result.to_json(), indent=1) + "\n", encoding="utf-8"
    )
    print(result.markdown(str(run.get("reader", "unnamed reader"))))
    return 0


def _configure_report(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dirs", type=Path, nargs="+")
    parser.add_argument(
        "--out", type=Path, required=True, help="folder for report.md and the plots"
    )


def _run_report(args: argparse.Namespace) -> int:
    results = [grade_run(run_dir) for run_dir in args.run_dirs]
    costs = [
        (r.label, c) for r, d in zip(results, args.run_dirs, strict=True) if (c := costs_of_run(d))
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    reader = ", ".join(dict.fromkeys(r.reader for r in results))
    parts = [score_table(results), lost_sets_table(results)]
    plot_score_by_distance(results, args.out / "score_by_distance.png")
    if costs:
        parts.append(cost_table(costs, reader=reader))
        plot_cost_by_segment(costs, args.out / "minutes_by_segment.png", reader=reader)
    (args.out / "report.md").write_text("\n".join(parts), encoding="utf-8")
    print("\n".join(parts))
    return 0


register(
    Command(
        "generate",
        "write a benchmark stream (stream.jsonl, ledger.jsonl, spec.json)",
        _configure_generate,
        _run_generate,
    )
)
register(
    Command(
        "grade",
        "score RUN_DIR/answers.jsonl against the run's stream",
        _configure_run_dir,
        _run_grade,
    )
)
register(
    Command(
        "audit",
        "compare the memory a run kept (RUN_DIR/notes.jsonl or summaries.jsonl) with the ledger",
        _configure_run_dir,
        _run_audit,
    )
)
register(
    Command(
        "report",
        "score and cost tables and plots for one or more runs",
        _configure_report,
        _run_report,
    )
)
_BUILT_IN = frozenset(COMMANDS)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="keeper-bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS.values():
        sub = subparsers.add_parser(command.name, help=command.help, description=command.help)
        command.configure(sub)
        sub.set_defaults(handler=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if not arguments or arguments[0] not in _BUILT_IN:
        _load_command_modules()  # only when needed: they may import the heavier arms
    args = build_parser().parse_args(arguments)
    try:
        return int(args.handler(args))
    except (FileNotFoundError, ValueError) as error:
        print(f"keeper-bench {args.command}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
