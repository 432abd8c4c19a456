"""``keeper-bench state-size``: one row per setting, and the state keeps every message only in
the setting that says so."""

from __future__ import annotations

from keeper_bench.cli import main


def test_state_size_prints_a_row_per_setting_and_writes_the_table(tmp_path, capsys):
    out = tmp_path / "state.md"
    assert main(["state-size", "--turns", "24", "--window", "2048", "--out", str(out)]) == 0
    rows = {
        cells[0]: cells
        for line in out.read_text().splitlines()
        if line.startswith("| window") or line.startswith("| all")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    assert set(rows) == {"window", "all", "window_with_keeper"}
    assert int(rows["all"][2]) == 2 * 25  # every input and every reply
    assert int(rows["window"][2]) < 25 and int(rows["window"][5]) >= 1  # cut down at cuts
    assert "load average" in capsys.readouterr().out
