"""``keeper-bench sensitivity``: each fault kind alone at several rates, one table per size; the
command itself runs here at the smallest size (as in CI)."""

from __future__ import annotations

import json

import pytest

from keeper_bench.cli import main as bench_main
from keeper_bench.sensitivity import (
    FAULT_KINDS,
    SensitivitySpec,
    cell_folder,
    cell_options,
)


def test_every_kind_is_alone_at_each_rate_and_the_clean_run_is_shared():
    spec = SensitivitySpec(arms=("notes", "summarize"), kinds=("sign_flip", "rot"), sizes=("tiny",))
    cells = spec.cells()
    assert [c for c in cells if c[2] == "none"] == [
        ("tiny", 1, "none", 0.0, "notes"),
        ("tiny", 1, "none", 0.0, "summarize"),
    ]
    assert len(cells) == 2 + 2 * 3 * 2  # clean, then two kinds at 2%, 5% and 10%
    assert cell_options("sign_flip", 0.05, 3) == {"faults": "sign_flip=0.05,seed=3"}
    assert cell_options("rot", 0.1, 3) == {"faults": "seed=3", "rot": 0.1}
    assert cell_options("stale_value", 0.0, 3) == {"faults": ""}
    assert set(FAULT_KINDS) >= {"overlooked", "wrong_actor", "stale_value", "drop_rules"}


def test_a_bad_spec_says_what_to_fix():
    with pytest.raises(ValueError, match="kinds: unknown"):
        SensitivitySpec(kinds=("misread",))
    with pytest.raises(ValueError, match="rates must be between 0 and 1"):
        SensitivitySpec(rates=(0.0, 2.0))


def test_the_command_writes_one_table_per_size_at_the_small_size(tmp_path, capsys):
    out = tmp_path / "sensitivity"
    argv = [
        "sensitivity",
        "--sizes",
        "tiny",
        "--arms",
        "notes,summarize",
        "--kinds",
        "overlooked,drop_rules",
        "--rates",
        "0,0.1",
        "--window",
        "4096",
        "--out",
        str(out),
        "--quiet",
    ]
    assert bench_main(argv) == 0
    table = (out / "README.md").read_text()
    assert "simulated reader" in table and "| fault | notes | summarize |" in table
    rows = [line for line in table.splitlines() if line.startswith(("| none", "| overlooked"))]
    assert len(rows) == 2
    cells = json.loads((out / "sensitivity.json").read_text())["cells"]
    assert {(c["kind"], c["rate"], c["arm"]) for c in cells} == {
        (kind, rate, arm)
        for kind, rate in (("none", 0.0), ("overlooked", 0.1), ("drop_rules", 0.1))
        for arm in ("notes", "summarize")
    }
    run = json.loads(
        (cell_folder(out, ("tiny", 1, "overlooked", 0.1, "notes")) / "run.json").read_text()
    )
    faults = {k: v for k, v in run["faults"].items() if v and k != "seed"}
    assert faults == {"overlooked": 0.1}
    clean = next(c for c in cells if c["kind"] == "none" and c["arm"] == "notes")
    overlooked = next(c for c in cells if c["kind"] == "overlooked" and c["arm"] == "notes")
    assert overlooked["right"] <= clean["right"]
    # finished cells are read back, not run again
    assert bench_main([*argv, "--finished-only"]) == 0
    assert "Not run" not in (out / "README.md").read_text()
