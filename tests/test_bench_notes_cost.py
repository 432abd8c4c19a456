"""``keeper-bench notes-cost``: the per-tenth cost table of a notes run, from its own process."""

from __future__ import annotations

from keeper_middleware.bench.notes_cost.command import main


def test_the_command_writes_a_row_per_tenth_and_labels_the_reader(tmp_path, capsys):
    out = tmp_path / "notes_cost.md"
    assert main(["--sizes", "tiny", "--work", str(tmp_path / "work"), "--out", str(out)]) == 0
    table = out.read_text(encoding="utf-8")
    assert "simulated reader" in table
    cost, _, made_of = table.partition("What each tenth is made of")
    for part in (cost, made_of):
        rows = [line for line in part.splitlines() if line.startswith("| ") and line[2].isdigit()]
        assert [row.split(" | ")[0] for row in rows] == [f"| {n}" for n in range(1, 11)]
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
