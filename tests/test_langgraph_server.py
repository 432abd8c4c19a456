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
