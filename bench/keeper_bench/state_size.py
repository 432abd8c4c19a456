"""What each ``state_messages`` setting costs in checkpoints: the size of a thread's latest state
and of its checkpoint database after N turns, and the keeper's CPU time over the run.

Run: ``keeper-bench state-size [--turns 60,300] [--window 4096] [--out FILE]``. The model is a
scripted clerk (``keeper_middleware.testing.ScriptedChatModel``): each turn records one register,
every seventh asks for an old one; note calls answer in change lines. The settings send the model
the same requests (``tests/test_state_messages.py``); only where the messages are kept differs.
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite import SqliteSaver

from keeper_middleware import Keeper, KeeperConfig, create_keeper_agent
from keeper_middleware.messages.facts import keeper_kind, text_of
from keeper_middleware.testing import ScriptedChatModel

SETTINGS = ("window", "all", "window_with_keeper")
RECORDED = re.compile(r"recorded (r\d+) at (\d+)")


def clerk(messages: list[BaseMessage]) -> AIMessage | str:
    """Notes the registers it read; answers a question from what it sees."""
    last = messages[-1]
    if keeper_kind(last) in ("notes_request", "notes_reask"):
        found = [RECORDED.findall(text_of(m)) for m in messages if keeper_kind(m) is None]
        lines = [f"SET {name} = {value}" for pairs in found for name, value in pairs]
        return "\n".join(dict.fromkeys(lines)) or "NO CHANGES"
    return "Noted."


def turn_text(turn: int) -> str:
    text = f"Item {turn}. The clerk recorded r{turn} at {(turn * 37) % 900 + 100}. " + (
        "The shop stayed quiet and the ledger lay open on the counter. " * 4
    )
    if turn % 7 == 0:
        text += f"\nQuestions: 1. What was r{max(1, turn - 20)} recorded at?"
    return text


def measure(setting: str, turns: int, window: int, folder: Path) -> dict[str, Any]:
    """One thread of ``turns`` inputs under one setting, on a SQLite checkpointer."""
    path = folder / f"{setting}-{turns}.sqlite3"
    config = KeeperConfig(window=window, state_messages=setting)  # type: ignore[arg-type]
    keeper = Keeper(config)
    thread: RunnableConfig = {"configurable": {"thread_id": "t"}}
    with SqliteSaver.from_conn_string(str(path)) as saver:
        agent = create_keeper_agent(
            ScriptedChatModel(default=clerk), keeper=keeper, checkpointer=saver
        )
        started = time.process_time()
        agent.invoke({"messages": [HumanMessage("Task: keep the registers.")]}, thread)
        for turn in range(1, turns + 1):
            agent.invoke({"messages": [HumanMessage(turn_text(turn))]}, thread)
        cpu = time.process_time() - started
        values = agent.get_state(thread).values
        state_bytes = len(JsonPlusSerializer().dumps_typed(values)[1])
        kept = len(values["messages"])
    return {
        "setting": setting,
        "turns": turns,
        "messages in state": kept,
        "latest state (KB)": round(state_bytes / 1024, 1),
        "checkpoint file (KB)": round(path.stat().st_size / 1024, 1),
        "cuts": keeper.counters("t").cuts,
        "CPU s": round(cpu, 2),
    }


def table(rows: Sequence[dict[str, Any]]) -> str:
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(row[k]) for k in header) + " |" for row in rows]
    return "\n".join(lines)


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--turns", default="60,300", help="comma-separated thread lengths")
    parser.add_argument("--window", type=int, default=4096)
    parser.add_argument("--out", type=Path, default=None, help="also write the table here")


def _run(args: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        for turns in (int(t) for t in str(args.turns).split(",")):
            rows += [measure(s, turns, args.window, Path(folder)) for s in SETTINGS]
    one, five, fifteen = os.getloadavg()
    text = f"{table(rows)}\n\nload average {one:.2f} {five:.2f} {fifteen:.2f} at the end\n"
    print(text, end="", flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    return 0


def register_commands(register: Callable[[Any], None]) -> None:
    """Adds ``keeper-bench state-size``."""
    from keeper_bench.cli import Command

    about = "checkpoint size after N turns under each state_messages setting"
    register(Command("state-size", about, _configure, _run))
