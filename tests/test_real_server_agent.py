"""The keeper without the proxy, with a real llama.cpp model server: ``create_keeper_agent`` and
the notes arm's local run.

The model is SmolLM2-135M-Instruct, so these tests pin the plumbing, never answer content: a
forced tool call goes round the keeper's own graph once and is answered; a short stream runs to
the end through the notes arm, is graded and records its costs; a stream cut short keeps its
first batches and question set; and a run killed outright leaves no server behind. Every request
has a timeout and ``max_tokens`` <= 64.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.real_llama import (
    TIMEOUT,
    counter_fixture,  # noqa: F401
    require_llama,
    server_fixture,  # noqa: F401
)

pytestmark = pytest.mark.real_server
require_llama()

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage  # noqa: E402
from langchain_core.runnables import RunnableBranch  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402

from keeper_bench.local_run import (  # noqa: E402
    PLUMBING_LABEL,
    LocalModelSettings,
    run_notes_arm_locally,
)
from keeper_bench.run_options import resolve_stream  # noqa: E402
from keeper_middleware.agent import create_keeper_agent  # noqa: E402
from keeper_middleware.config import KeeperConfig  # noqa: E402
from keeper_middleware.messages.facts import keeper_kind  # noqa: E402


class ToolForcingModel:
    """Forces one named tool while the newest input has had no tool result yet, and leaves every
    other call free, so the agent calls the tool once, reads its result and answers (a forced
    choice on every call would loop), and the keeper's note calls get no forced tool.

    Needed because ``KeeperNode`` binds the tools itself with ``model.bind_tools(tools)``.
    """

    def __init__(self, model: ChatOpenAI, tool_name: str) -> None:
        self.model = model
        self.tool_name = tool_name

    def bind_tools(self, tools: list[Any], **kwargs: Any) -> Any:
        forced = self.model.bind_tools(tools, tool_choice=self.tool_name, **kwargs)
        return RunnableBranch(
            (awaits_a_tool_result, forced), self.model.bind_tools(tools, **kwargs)
        )


def awaits_a_tool_result(messages: list[BaseMessage]) -> bool:
    """The newest input is a user's (what the keeper placed after it aside); a note call's is not."""
    for message in reversed(messages):
        kind = keeper_kind(message)
        if kind is None:
            return isinstance(message, HumanMessage)
        if kind.startswith("notes_"):
            return False
    return False


def test_a_forced_tool_call_round_trip_through_create_keeper_agent(server, counter):
    asked: list[str] = []

    @tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        asked.append(city)
        return f"Sunny in {city}, 21 C."

    model = ChatOpenAI(
        model=server.model_alias,
        base_url=server.base_url,
        api_key="unused",
        timeout=TIMEOUT,
        max_retries=1,
        temperature=0,
        max_tokens=40,
        stream_usage=True,
    )
    agent = create_keeper_agent(
        ToolForcingModel(model, "get_weather"),
        [get_weather],
        system_prompt="You answer weather questions.",
        config=KeeperConfig(window=2048, reply_reserve=256),
        token_counter=counter,
    )
    result = agent.invoke(
        {"messages": [HumanMessage("What is the weather in Paris?")]},
        {"configurable": {"thread_id": "weather"}, "recursion_limit": 12},
    )
    messages = result["messages"]
    calls = [m for m in messages if isinstance(m, AIMessage) and m.tool_calls]
    assert [c["name"] for m in calls for c in m.tool_calls] == ["get_weather"]
    assert len(asked) == 1
    assert any(isinstance(m, ToolMessage) and "Sunny" in str(m.content) for m in messages)
    final = messages[-1]
    assert isinstance(final, AIMessage) and not final.tool_calls
    assert 1 <= final.usage_metadata["output_tokens"] <= 40


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_notes_arm_runs_a_short_stream_to_the_end_and_is_graded(server, tmp_path):
    """A plumbing check: the first 6 batches of the tiny stream (one question set), window 1536.
    SmolLM2's score is whatever it is; the run must finish, be graded and record its costs."""
    stream = resolve_stream("tiny", tmp_path / "full")
    result = run_notes_arm_locally(
        stream,
        tmp_path / "local",
        1536,
        batches=6,
        settings=LocalModelSettings(max_tokens=32, timeout=TIMEOUT),
        server=server,
    )
    run = result.run
    assert result.batches == 6
    assert run.grade.label == PLUMBING_LABEL
    assert run.grade.scored  # every question of the copy was graded
    assert (run.run_dir / "grade.json").exists() and (run.run_dir / "costs.json").exists()
    assert run.costs is not None and run.costs.calls >= 7
    calls = [json.loads(line) for line in (run.run_dir / "calls.jsonl").read_text().splitlines()]
    assert all(c["completion_tokens"] <= 32 for c in calls)
    assert json.loads((run.run_dir / "progress.json").read_text())["finished"] is True


def test_truncating_a_stream_keeps_its_first_batches_and_question_set(tmp_path):
    from keeper_bench.local_run import truncate_stream
    from keeper_bench.streams import read_stream

    stream = resolve_stream("tiny", tmp_path / "full")
    short = truncate_stream(stream, tmp_path / "short", batches=6)
    kinds = [record["type"] for record in read_stream(short)]
    assert kinds == ["batch"] * 5 + ["questions", "batch"]
    assert {p.name for p in short.iterdir()} == {p.name for p in Path(stream).iterdir()}
    with pytest.raises(ValueError, match="no question set"):
        truncate_stream(stream, tmp_path / "none", batches=4)


def test_a_killed_local_run_leaves_no_server_behind(tmp_path):
    """The run is killed outright (no teardown, no atexit) while its server is up."""
    stream = resolve_stream("tiny", tmp_path / "full")
    out = tmp_path / "killed"
    runner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "keeper_bench.local_run",
            *("--stream", str(stream), "--batches", "6", "--window", "1536"),
            *("--out", str(out)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + TIMEOUT
        while not (out / "run" / "run.json").exists():  # written once the server answers
            assert runner.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        servers = [pid for pid in children_of(runner.pid) if b"llama_compat" in cmdline(pid)]
        assert len(servers) == 1
    finally:
        runner.send_signal(signal.SIGKILL)
        runner.wait(timeout=TIMEOUT)
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and group_alive(servers[0]):
        time.sleep(0.1)
    assert not group_alive(servers[0])


def children_of(pid: int) -> list[int]:
    return [
        int(child)
        for task in Path(f"/proc/{pid}/task").iterdir()
        for child in (task / "children").read_text().split()
    ]


def cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True
