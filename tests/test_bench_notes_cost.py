"""``keeper-bench notes-cost``: the per-tenth cost table of a notes run, from its own process."""

from __future__ import annotations

import json

import pytest

from keeper_middleware.bench.notes_cost.clock import PHASES
from keeper_middleware.bench.notes_cost.command import main


def test_the_command_writes_a_row_per_tenth_and_labels_the_reader(tmp_path, capsys):
    out = tmp_path / "notes_cost.md"
    assert main(["--sizes", "tiny", "--work", str(tmp_path / "work"), "--out", str(out)]) == 0
    table = out.read_text(encoding="utf-8")
    assert "simulated reader" in table
    cost, _, rest = table.partition("The keeper's CPU by phase")
    by_phase, _, made_of = rest.partition("What each tenth is made of")
    for part in (cost, by_phase, made_of):
        rows = [line for line in part.splitlines() if line.startswith("| ") and line[2].isdigit()]
        assert [row.split(" | ")[0] for row in rows] == [f"| {n}" for n in range(1, 11)]
    for phase in PHASES:
        assert f"| {phase} |" in by_phase.splitlines()[2] and f"- {phase}: " in by_phase
    assert "Peak RSS of the run's process" in table
    assert "NOTES tok / work call" in made_of
    assert (tmp_path / "work" / "harder-tiny-seed0" / "run" / "audit.json").exists()
    capsys.readouterr()
    assert main(["--explain", str(tmp_path / "work")]) == 0
    explained = capsys.readouterr().out
    assert "harder-tiny-seed0" in explained
    assert explained.count("\n| ") >= 11


def test_the_search_tool_the_graphs_call_counts_as_the_keepers_cpu():
    from keeper_middleware.bench.notes_cost.command import KeeperClock
    from keeper_middleware.keeper import Keeper

    keeper = Keeper()
    clock = KeeperClock()
    with clock.installed():
        for number in range(200):
            keeper.run_search_tool("s", {"query": f"where did counter {number} end up"})
    assert clock.keeper > 0
    spent = clock.keeper
    keeper.run_search_tool("s", {"query": "after the clock is gone"})
    assert clock.keeper == spent


def test_the_phases_of_each_tenth_add_up_to_its_keeper_cpu(tmp_path, capsys):
    assert main(["--sizes", "tiny", "--work", str(tmp_path / "work")]) == 0
    capsys.readouterr()
    result = json.loads((tmp_path / "work" / "harder-tiny-seed0" / "result.json").read_text())
    assert len(result["phases"]) == len(result["tenths"]) == 10
    for phases, tenth in zip(result["phases"], result["tenths"], strict=True):
        assert set(phases) == set(PHASES)
        assert all(seconds >= 0 for seconds in phases.values())
        assert sum(phases.values()) == pytest.approx(tenth["keeper_cpu_s"], abs=1e-9)
    # the work a notes run always does shows in its phase
    total = {name: sum(row[name] for row in result["phases"]) for name in PHASES}
    assert total["prepare"] > 0 and total["note request"] > 0 and total["commit"] > 0
    assert total["indexing"] > 0
