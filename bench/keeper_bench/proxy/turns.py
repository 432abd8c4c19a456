"""The user messages an agent sends a proxy, call by call, from a stream (shared by the proxy's
cost and side-by-side benchmarks)."""

from __future__ import annotations

from pathlib import Path

from keeper_bench.steps import plan_steps
from keeper_bench.streams import read_stream


def agent_turns(stream: Path, per_call: int) -> list[list[str]]:
    """The user messages of each call: the task alone, then ``per_call`` stream messages a call."""
    messages = [step.message for step in plan_steps(read_stream(stream), "messages")]
    return [messages[:1]] + [messages[i : i + per_call] for i in range(1, len(messages), per_call)]
