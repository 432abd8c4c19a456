"""The ``langgraph.json`` example: every graph it names loads as a compiled graph, and runs
asynchronously under the blocking-call detector that ``langgraph dev`` uses."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path

from blockbuster import blockbuster_ctx
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.pregel import Pregel

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "langgraph_server"


def load_graph(reference: str) -> object:
    path, _, attribute = reference.partition(":")
    spec = importlib.util.spec_from_file_location("keeper_langgraph_example", EXAMPLE / path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, attribute)


def test_every_graph_in_langgraph_json_loads_and_runs_without_blocking(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KEEPER_ARCHIVE", str(tmp_path / "state" / "archive.sqlite3"))
    monkeypatch.setenv("KEEPER_MODEL", "")
    config = json.loads((EXAMPLE / "langgraph.json").read_text())
    assert config["graphs"]
    for name, reference in config["graphs"].items():
        graph = load_graph(reference)
        assert isinstance(graph, Pregel), name
        graph.checkpointer = InMemorySaver()  # what the server supplies
        thread = {"configurable": {"thread_id": name}}

        async def drive(graph: Pregel = graph, thread: dict = thread) -> str:
            with blockbuster_ctx():
                await graph.ainvoke({"messages": [HumanMessage("Read each item.")]}, thread)
                for item in range(1, 13):
                    story = f"Item {item}.\nMira Holt recorded domo{item:02d} at {item * 3}."
                    await graph.ainvoke({"messages": [HumanMessage(story)]}, thread)
                out = await graph.ainvoke(
                    {"messages": [HumanMessage("Questions.\n1. What value does domo02 hold now?")]},
                    thread,
                )
            return str(out["messages"][-1].content)

        assert asyncio.run(drive()) == "1. 6"
        assert graph.keeper.counters(name).cuts >= 1  # type: ignore[attr-defined]
        assert (tmp_path / "state" / "archive.sqlite3").exists()


def test_langgraph_dev_serves_the_example_and_runs_it(tmp_path):
    """``langgraph dev`` (the ``server`` extra) serves ``langgraph.json``'s graph on 127.0.0.1
    and a run through its HTTP API reaches the keeper (offline: the simulated reader answers)."""
    import os
    import shutil
    import socket
    import subprocess
    import sys
    import time

    import httpx
    import pytest

    cli = Path(sys.executable).with_name("langgraph")
    if not cli.exists():
        pytest.skip("langgraph-cli is not installed: pip install 'keeper-middleware[server]'")
    app = tmp_path / "app"
    shutil.copytree(EXAMPLE, app)
    config = json.loads((app / "langgraph.json").read_text())
    config["dependencies"] = [str(EXAMPLE.parents[1])]
    config["env"]["KEEPER_ARCHIVE"] = str(tmp_path / "state" / "archive.sqlite3")
    (app / "langgraph.json").write_text(json.dumps(config))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        **os.environ,
        "KEEPER_MODEL": "",
        "KEEPER_ARCHIVE": str(tmp_path / "state" / "archive.sqlite3"),
        "LANGSMITH_TRACING": "false",
        "LANGGRAPH_CLI_NO_ANALYTICS": "1",
        "HF_HUB_OFFLINE": "1",
    }
    server = subprocess.Popen(
        [
            str(cli),
            "dev",
            "--no-browser",
            "--no-reload",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        cwd=app,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{base}/ok", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert server.poll() is None, server.stdout.read() if server.stdout else ""
            assert time.monotonic() < deadline, "langgraph dev did not start"
            time.sleep(0.5)
        thread = httpx.post(f"{base}/threads", json={}, timeout=30).json()["thread_id"]
        for text in ["Read each item.", "Item 1.\nMira Holt recorded domo01 at 3."]:
            reply = httpx.post(
                f"{base}/threads/{thread}/runs/wait",
                json={
                    "assistant_id": "keeper_agent",
                    "input": {"messages": [{"role": "user", "content": text}]},
                },
                timeout=60,
            )
            assert reply.status_code == 200, reply.text
        state = reply.json()
        assert state["messages"][-1]["type"] == "ai"
        humans = [m["id"] for m in state["messages"] if m["type"] == "human"]
        assert len(humans) == 2 and set(humans) <= set(state["keeper"]["seen"])  # the keeper's
        assert (tmp_path / "state" / "archive.sqlite3").exists()
        # streamed as a chat UI streams it, past a cut and a question: no keeper message
        stories = [f"Item {n}.\nMira Holt recorded domo{n:02d} at {n * 3}." for n in range(2, 13)]
        streamed = []
        for text in [*stories, "Questions.\n1. What value does domo02 hold now?"]:
            run = httpx.post(
                f"{base}/threads/{thread}/runs/stream",
                json={
                    "assistant_id": "keeper_agent",
                    "input": {"messages": [{"role": "user", "content": text}]},
                    "stream_mode": ["messages-tuple"],
                    "stream_subgraphs": True,
                },
                timeout=60,
            )
            assert run.status_code == 200, run.text
            streamed += [line for line in run.text.splitlines() if line.startswith("data:")]
        assert any('"1. 6"' in line for line in streamed)  # the answer, found in the archive
        assert not [line for line in streamed if "[NOTES]" in line or "keeper_mark" in line]
        values = httpx.get(f"{base}/threads/{thread}/state", timeout=30).json()["values"]
        assert not [m for m in values["messages"] if "keeper" in m.get("additional_kwargs", {})]
        kept = [e["msg"] for e in values["keeper"]["view"] if "ref" not in e]
        assert any("[NOTES]" in str(m["data"]["content"]) for m in kept)  # a cut, in the view
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_example_keeps_its_archive_outside_the_folder_the_dev_server_watches(
    tmp_path, monkeypatch
):
    """``langgraph dev`` reloads on changes in the app folder: the archive's default home is the
    user's state folder, and an archive kept in the folder anyway (``.keeper/``) is ignored by git."""
    monkeypatch.chdir(EXAMPLE)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv(
        "KEEPER_ARCHIVE",
        json.loads((EXAMPLE / "langgraph.json").read_text())["env"]["KEEPER_ARCHIVE"],
    )
    monkeypatch.setenv("KEEPER_MODEL", "")
    graph = load_graph("./agent.py:agent")
    location = Path(graph.keeper.archive.path)  # type: ignore[attr-defined]
    assert (
        location
        == tmp_path / "state" / "keeper-middleware" / "langgraph_server" / "archive.sqlite3"
    )
    assert EXAMPLE not in location.parents
    graph.keeper.close()  # type: ignore[attr-defined]
    ignored = (EXAMPLE.parents[1] / ".gitignore").read_text().split()
    assert ".keeper/" in ignored
