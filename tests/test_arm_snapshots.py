"""Each arm's graph has a pinned shape (rewrite the files with UPDATE_SNAPSHOTS=1)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from langchain_core.tools import tool

from keeper_bench.arms import ARMS, build_arm
from keeper_bench.reader import SimulatedReader

SNAPSHOTS = Path(__file__).parent / "snapshots"


@tool
def read_next_batch() -> str:
    """Read the next batch of the stream."""
    return "No more batches for now."


@pytest.mark.parametrize("name", sorted(ARMS))
def test_the_arm_graph_matches_its_snapshot(name):
    arm = build_arm(name, SimulatedReader(), window=4096, tools=[read_next_batch])
    drawn = arm.graph.get_graph().draw_mermaid(with_styles=False)
    path = SNAPSHOTS / f"arm_{name}.mmd"
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        SNAPSHOTS.mkdir(exist_ok=True)
        path.write_text(drawn, encoding="utf-8")
    assert path.exists(), f"no snapshot for {name}: run with UPDATE_SNAPSHOTS=1 and commit it"
    assert drawn == path.read_text(encoding="utf-8")
    arm.close()
