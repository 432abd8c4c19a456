"""What memory that follows the graph costs: storage as a thread forks, and a step on a long
thread that never forks.

Run: ``keeper-bench branches-cost [--items 1500] [--forks 0,1,2,4,8] [--out FILE]``, or as a
script, ``python bench/keeper_bench/branches_cost.py ...``, which runs against whichever keeper-middleware is
importable (so the same measurement runs on an earlier release: its own tree on PYTHONPATH).

- **Storage with N forks**: a thread of ``--base`` items through ``create_keeper_agent`` (the
  simulated reader, SQLite archive and checkpoints); then N times, back to the checkpoint after
  half of them (LangGraph time travel) and ``--fork-items`` new items from there. After each
  count: the archive's records (turn rows), link rows, cuts, NOTES versions, file bytes and
  search passages. Each fork should add the records of what it says, nothing copied.
- **A step on a long linear thread**: ``--items`` items on one thread; the CPU time of every
  keeper step (``Keeper.step``, the keeper's own work: the reader and the checkpointer are not
  in it), steps without a cut in the first and last tenth of the thread, and steps with a cut.

Only APIs both releases have are used; memory semantics differ (the earlier release keeps one
memory per thread), which this measures the cost of, not the answers.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from langchain_core.messages import HumanMessage
from langgraph.checkpoint.sqlite import SqliteSaver

from keeper_bench.reader import SimulatedReader
from keeper_middleware import Keeper, KeeperConfig, create_keeper_agent

CONFIG = KeeperConfig(window=8192, notes_every_items=5)
ACTORS = ("Mira Holt", "Tomas Quill", "Ana Reyes", "Ivo Brand")


def story(item: int, label: str = "") -> str:
    """One item of the stream: a counter recorded and changed, by people the reader tracks."""
    name = f"{label}domo{item % 400:03d}"
    return (
        f"Item {item}.\n{ACTORS[item % 4]} recorded {name} at {item * 3 % 997}. "
        f"{ACTORS[(item + 1) % 4]} took {item % 7 + 1} from {name}. "
        "The harbour stayed quiet and the mill turned slowly all afternoon."
    )


class StepClock:
    """CPU time of every ``Keeper.step`` call, and whether it cut."""

    def __init__(self, keeper: Keeper) -> None:
        self.samples: list[tuple[float, bool]] = []
        inner = keeper.step

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.process_time()
            result = inner(*args, **kwargs)
            self.samples.append((time.process_time() - started, bool(result.cut)))
            return result

        keeper.step = timed  # type: ignore[method-assign]


def _agent(folder: Path) -> tuple[Keeper, Any, sqlite3.Connection]:
    keeper = Keeper(CONFIG, archive=folder / "archive.sqlite3")
    conn = sqlite3.connect(folder / "checkpoints.sqlite3", check_same_thread=False)
    graph = create_keeper_agent(SimulatedReader(), keeper=keeper, checkpointer=SqliteSaver(conn))
    return keeper, graph, conn


def _say(graph: Any, text: str, config: dict[str, Any]) -> None:
    graph.invoke({"messages": [HumanMessage(text)]}, config)


def storage(folder: Path, base: int, fork_items: int, counts: Sequence[int]) -> list[list[str]]:
    keeper, graph, conn = _agent(folder)
    thread = {"configurable": {"thread_id": "bench"}}
    _say(
        graph,
        "Read each item. Standing rule: any figure below zero is reported as overdrawn.",
        thread,
    )
    fork_point = None
    for item in range(1, base + 1):
        _say(graph, story(item), thread)
        if item == base // 2:
            fork_point = graph.get_state(thread).config
    assert fork_point is not None
    rows = [_storage_row(keeper, folder, 0)]
    made = 0
    for count in counts:
        while made < count:
            made += 1
            config: dict[str, Any] = fork_point
            for item in range(base // 2 + 1, base // 2 + fork_items + 1):
                _say(graph, story(item, label=f"f{made}x"), config)
                config = thread
            if made == count:
                rows.append(_storage_row(keeper, folder, made))
    keeper.close()
    conn.close()
    return [row for row in rows if int(row[0]) in {0, *counts}]


def _storage_row(keeper: Keeper, folder: Path, forks: int) -> list[str]:
    path = folder / "archive.sqlite3"
    with sqlite3.connect(path) as raw:
        raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")}

        def count(table: str) -> int:
            return int(raw.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])

        records = count("turns")
        links = count("links") if "links" in tables else 0
        cuts = count("cuts")
        versions = count("notes")
        size = (
            raw.execute("PRAGMA page_count").fetchone()[0]
            * raw.execute("PRAGMA page_size").fetchone()[0]
        )
    index = folder / "archive.index" / "keyword.sqlite3"
    with sqlite3.connect(index) as raw:
        raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        passages = raw.execute("SELECT COUNT(*) FROM kw_passages").fetchone()[0]
    return [
        str(forks),
        f"{records:,}",
        f"{links:,}",
        f"{cuts:,}",
        f"{versions:,}",
        f"{size / 1024:,.0f} KiB",
        f"{passages:,}",
    ]


def linear(folder: Path, items: int) -> list[list[str]]:
    keeper, graph, conn = _agent(folder)
    clock = StepClock(keeper)
    thread = {"configurable": {"thread_id": "bench"}}
    _say(
        graph,
        "Read each item. Standing rule: any figure below zero is reported as overdrawn.",
        thread,
    )
    for item in range(1, items + 1):
        _say(graph, story(item), thread)
    keeper.close()
    conn.close()
    samples = clock.samples
    tenth = max(1, len(samples) // 10)
    first = [t for t, cut in samples[:tenth] if not cut]
    last = [t for t, cut in samples[-tenth:] if not cut]
    cuts = [t for t, cut in samples if cut]
    return [
        ["steps (cuts)", f"{len(samples):,} ({len(cuts):,})"],
        ["step without a cut, first tenth", _ms(first)],
        ["step without a cut, last tenth", _ms(last)],
        ["step with a cut", _ms(cuts)],
        ["keeper CPU in all", f"{sum(t for t, _ in samples):.2f} s"],
    ]


def _ms(samples: list[float]) -> str:
    if not samples:
        return "none"
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return f"median {statistics.median(samples) * 1000:.2f} ms, p95 {p95 * 1000:.2f} ms (n={len(samples)})"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _where() -> str:
    import keeper_middleware

    root = Path(keeper_middleware.__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        commit = ""
    return f"keeper-middleware from {root}" + (f" at {commit}" if commit else "")


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--items", type=int, default=1500, help="items of the linear thread")
    parser.add_argument("--base", type=int, default=200, help="items before the forks")
    parser.add_argument("--fork-items", type=int, default=20, help="items each fork adds")
    parser.add_argument("--forks", default="0,1,2,4,8", help="fork counts to measure at")
    parser.add_argument("--out", type=Path, default=None, help="also write the tables here")


def _run(args: argparse.Namespace) -> int:
    counts = sorted({int(n) for n in args.forks.split(",") if n.strip()} - {0})
    load = os.getloadavg()
    parts = [
        f"{_where()}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the start",
        "",
        f"Storage with N forks ({args.base} items, then N forks back to item {args.base // 2}, "
        f"{args.fork_items} items each; simulated reader, window {CONFIG.window})",
        "",
    ]
    with tempfile.TemporaryDirectory() as folder:
        rows = storage(Path(folder), args.base, args.fork_items, counts)
    parts.append(
        _table(["forks", "records", "links", "cuts", "NOTES versions", "archive", "passages"], rows)
    )
    parts += ["", f"A step on a linear thread of {args.items} items (CPU of Keeper.step)", ""]
    with tempfile.TemporaryDirectory() as folder:
        parts.append(_table(["what", "result"], linear(Path(folder), args.items)))
    load = os.getloadavg()
    parts += ["", f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end"]
    text = "\n".join(parts)
    print(text, flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


def register_commands(register: Callable[[Any], None]) -> None:
    """Adds ``keeper-bench branches-cost``."""
    from keeper_bench.cli import Command

    register(
        Command(
            "branches-cost",
            "storage as a thread forks, and a keeper step on a long linear thread",
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
