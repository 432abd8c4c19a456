"""What a conversation imported at once costs, by its size: 600 to 20,000 messages in one invoke.

Run: ``python -m keeper_bench.bulk_import [--sizes 600,2000,5000,20000]`` (or
``keeper-bench bulk-import``). Each size is a fresh thread on a real SQLite archive file with
its keyword index: a task, then items (the benchmark's story sentences, each naming counters),
each answered by a reply, and every tenth item a round of two parallel tool calls with their
results. The whole history arrives in one invoke, as an import does; the keeper notes it in
parts, a cut each. The model writes a SET line for every counter the noted turns record (the
keeper checks, applies, fits and commits them); its reply is instant, so the figures are the
keeper's own cost. Measured twice: ``Keeper.step`` alone, and one ``invoke`` of
``create_keeper_agent`` (with LangGraph's in-memory checkpointer, which stores the imported
state too). CPU time, not wall time (on a shared machine the wall clock measures neighbours).

The target (an import's cost per message stays within 2x of a 600-message import) is read
from the last column.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult

from keeper_bench.step_cost import batch_text
from keeper_middleware.config import KeeperConfig
from keeper_middleware.keeper import Keeper, ModelSetup
from keeper_middleware.messages.facts import keeper_kind, text_of

_RECORDED = re.compile(r"recorded (ctr\d+) at ([a-z -]+?)\.")
SYSTEM = "You keep a ledger of counters. Answer from the NOTES and the archive."


def imported_history(messages: int) -> list[BaseMessage]:
    """About ``messages`` messages: a task, then items with replies, and every tenth item two
    parallel tool calls with their results."""
    history: list[BaseMessage] = [HumanMessage("Task: keep the ledger of every counter.")]
    item = 0
    while len(history) < messages:
        item += 1
        history.append(HumanMessage(batch_text(item, sentences=3)))
        if item % 10 == 0:
            looked = [(f"ctr{item:04d}", f"l{item}a"), (f"ctr{item + 1:04d}", f"l{item}b")]
            calls = [{"name": "look", "args": {"what": what}, "id": cid} for what, cid in looked]
            history.append(AIMessage("", tool_calls=calls))
            history += [
                ToolMessage(f"{what} looks right.", tool_call_id=cid) for what, cid in looked
            ]
        history.append(AIMessage(f"Noted item {item}."))
    return history


def note_reply(messages: Sequence[BaseMessage]) -> AIMessage:
    """A SET line for every counter the turns since the NOTES record; "ok" to work calls."""
    if keeper_kind(messages[-1]) not in ("notes_request", "notes_reask"):
        return AIMessage("ok")
    start = next(
        (i + 1 for i in reversed(range(len(messages))) if keeper_kind(messages[i]) == "notes"), 0
    )
    seen = "\n".join(text_of(m) for m in messages[start:-1])
    lines = [f"SET {name} = {amount}" for name, amount in _RECORDED.findall(seen)]
    return AIMessage("\n".join(lines) or "NO CHANGES")


class InstantModel(BaseChatModel):
    """A chat model that answers at once with :func:`note_reply` (no tools to bind)."""

    @property
    def _llm_type(self) -> str:
        return "instant-notes"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=note_reply(messages))])


@dataclass(frozen=True, slots=True)
class Measured:
    messages: int
    step_cpu: float
    invoke_cpu: float
    cuts: int
    archived: int


def measure(messages: int, window: int, folder: Path) -> Measured:
    history = imported_history(messages)
    config = KeeperConfig(window=window)
    keeper = Keeper(config, archive=folder / f"step-{messages}.sqlite3")
    started = time.process_time()
    keeper.step("import", history, None, ModelSetup(system_prompt=SYSTEM), _call)
    step_cpu = time.process_time() - started
    cuts = keeper.counters("import").cuts
    archived = keeper.archive.turn_count("import")
    keeper.close()
    invoke_cpu = _through_agent(history, config, folder / f"agent-{messages}.sqlite3")
    return Measured(len(history), step_cpu, invoke_cpu, cuts, archived)


def _call(messages: list[BaseMessage], kwargs: Any) -> AIMessage:
    return note_reply(messages)


def _through_agent(history: list[BaseMessage], config: KeeperConfig, archive: Path) -> float:
    from langgraph.checkpoint.memory import InMemorySaver

    from keeper_middleware.agent import create_keeper_agent

    keeper = Keeper(config, archive=archive)
    agent = create_keeper_agent(
        InstantModel(),
        system_prompt=SYSTEM,
        keeper=keeper,
        checkpointer=InMemorySaver(),
        search=False,
    )
    started = time.process_time()
    agent.invoke({"messages": history}, {"configurable": {"thread_id": "import"}})
    spent = time.process_time() - started
    keeper.close()
    return spent


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def _commit() -> str:
    try:
        found = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        )
        return found.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def table(rows: Sequence[Measured], window: int) -> str:
    base = rows[0]
    lines = [
        f"Bulk import, one invoke: window {window:,} tokens, real SQLite archive and keyword "
        "index, instant scripted model that writes a SET line per recorded counter (CPU time)",
        "",
        "| messages | cuts | archived turns | Keeper.step CPU s | ms a message | "
        "create_keeper_agent invoke CPU s | ms a message | a message vs the smallest |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        step_ms = row.step_cpu * 1000 / row.messages
        invoke_ms = row.invoke_cpu * 1000 / row.messages
        ratio = (row.invoke_cpu / row.messages) / (base.invoke_cpu / base.messages)
        lines.append(
            f"| {row.messages:,} | {row.cuts} | {row.archived:,} | {row.step_cpu:.2f} | "
            f"{step_ms:.3f} | {row.invoke_cpu:.2f} | {invoke_ms:.3f} | {ratio:.2f}x |"
        )
    return "\n".join(lines)


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sizes", default="600,2000,5000,20000", help="messages per import, comma separated"
    )
    parser.add_argument("--window", type=int, default=32_768)
    parser.add_argument(
        "--out", type=Path, default=None, help="also write the table here (markdown)"
    )


def _run(args: argparse.Namespace) -> int:
    sizes = [int(size) for size in args.sizes.split(",") if size.strip()]
    before = _loadavg()
    rows: list[Measured] = []
    with tempfile.TemporaryDirectory(prefix="keeper-bulk-") as folder:
        for size in sizes:
            rows.append(measure(size, args.window, Path(folder)))
            print(f"{size} messages: done", flush=True)
    text = table(rows, args.window)
    footer = (
        f"\nCommand: `keeper-bench bulk-import --sizes {args.sizes} --window {args.window}`. "
        f"At {_commit()}, pid {os.getpid()}; load average (1, 5, 15 min) {before} before, "
        f"{_loadavg()} after."
    )
    print(text + footer, flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n" + footer + "\n")
    return 0


def register_commands(register: Callable[[Any], None]) -> None:
    """Adds ``keeper-bench bulk-import``."""
    from keeper_bench.cli import Command

    register(
        Command("bulk-import", "cost of one invoke importing a whole history", _configure, _run)
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    _configure(parser)
    return _run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
