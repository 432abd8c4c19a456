"""``keeper-bench notes-cost``: the per-tenth cost table of a notes run, from its own process."""

from __future__ import annotations

import json

import pytest

from keeper_bench.notes_cost.clock import PHASES
from keeper_bench.notes_cost.command import main


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
    from keeper_bench.notes_cost.command import KeeperClock
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


def test_a_baseline_arm_is_the_control_with_no_keeper_cpu_and_no_notes(tmp_path, capsys):
    out = tmp_path / "control.md"
    work = tmp_path / "work"
    argv = ["--sizes", "tiny", "--arm", "window_drop", "--work", str(work), "--out", str(out)]
    assert main(argv) == 0
    capsys.readouterr()
    table = out.read_text(encoding="utf-8")
    assert table.startswith("Arm window_drop on the harder stream")
    assert ", arm window_drop" in table and "simulated reader" in table
    assert "runs no keeper: its keeper CPU is 0 and it has no NOTES" in table
    assert "Final NOTES" not in table and "What each tenth is made of" not in table
    result = json.loads((work / "harder-tiny-seed0" / "result.json").read_text())
    assert result["arm"] == "window_drop" and result["keeper"] is False
    assert len(result["tenths"]) == 10
    assert all(row["keeper_cpu_s"] == 0 for row in result["tenths"])
    # the control still sends requests, and they are counted the same way as the notes arm's
    assert sum(row["prompt"] for row in result["tenths"]) > 0


def test_the_notes_arm_is_named_in_its_result_and_its_table_keeps_its_title(tmp_path, capsys):
    out = tmp_path / "notes.md"
    assert main(["--sizes", "tiny", "--work", str(tmp_path / "work"), "--out", str(out)]) == 0
    capsys.readouterr()
    result = json.loads((tmp_path / "work" / "harder-tiny-seed0" / "result.json").read_text())
    assert result["arm"] == "notes" and result["keeper"] is True
    table = out.read_text(encoding="utf-8")
    assert table.startswith("Notes arm on the harder stream") and ", arm " not in table


def test_a_cut_costs_its_tenths_cpu_over_its_notes_calls_and_a_tenth_without_one_has_none():
    from keeper_bench.notes_cost.breakdown import cost_per_cut, render_cost_per_cut

    # 1M tokens: a tenth is 100K, so CPU per 100K is the tenth's CPU in seconds
    tenths = [
        {"keeper_cpu_s": cpu} for cpu in (0.0, 0.42, 0.48, 0.56, 0.48, 0.48, 0.48, 0.5, 0.5, 0.54)
    ]
    rows = [{"notes_calls": cuts} for cuts in (0, 7, 8, 8, 8, 8, 8, 8, 8, 9)]
    costs = cost_per_cut(tenths, rows, 1_000_000)
    assert costs[0] is None
    assert costs[1] == pytest.approx(0.06) and costs[-1] == pytest.approx(0.06)
    assert costs[3] == pytest.approx(0.07)
    # a stream of 240K: a tenth is 24K tokens, so a tenth's CPU is a quarter of its figure
    assert cost_per_cut([{"keeper_cpu_s": 0.5}], [{"notes_calls": 2}], 240_000) == [
        pytest.approx(0.5 * 0.24 / 2)
    ]
    # no sentence while the first tenth made no cut
    result = {"tenths": tenths, "breakdown": rows, "stream_tokens": 1_000_000}
    assert render_cost_per_cut(result) == ""
    rows[0] = {"notes_calls": 5}
    tenths[0] = {"keeper_cpu_s": 0.25}
    sentence = render_cost_per_cut(result)
    assert sentence.startswith("Keeper CPU a cut")
    assert "first tenth 50.0 ms, last 60.0 ms (+20%); tenths 2–9 60.0–70.0 ms." in sentence


def test_the_runs_process_freezes_its_start_up_objects_after_the_first_step(tmp_path, capsys):
    assert main(["--sizes", "tiny", "--work", str(tmp_path / "work")]) == 0
    capsys.readouterr()
    result = json.loads((tmp_path / "work" / "harder-tiny-seed0" / "result.json").read_text())
    # the imported modules and the built graph: a full collection no longer walks them
    assert result["frozen_objects"] > 10_000
