"""Statistics of the comparisons: means over seeds with 95% intervals, and the realistic fault
mix with each of its faults (context rot included) left out in turn."""

from __future__ import annotations

import pytest

from keeper_bench.cli import main as bench_main
from keeper_bench.fault_breakdown import LEFT_OUT, mix_options, mixes
from keeper_bench.intervals import t_interval
from keeper_bench.run_options import parse_faults


def test_an_interval_is_the_mean_and_its_student_t_half_width():
    interval = t_interval([10.0, 12.0, 14.0])
    assert interval.mean == 12.0
    assert interval.half_width == pytest.approx(4.303 * 2.0 / 3**0.5, rel=1e-3)
    assert interval.cell() == "12.0 ± 5.0"
    assert t_interval([7.0]).cell() == "7 (1 seed)"
    assert not t_interval([1.0, 1.1, 0.9]).overlaps(t_interval([5.0, 5.1, 4.9]))
    assert t_interval([1.0, 5.0, 3.0]).overlaps(t_interval([4.0, 4.5, 5.0]))
    with pytest.raises(ValueError, match="at least one value"):
        t_interval([])


def test_each_row_leaves_exactly_one_fault_of_the_realistic_mix_out():
    full = parse_faults(mix_options("realistic", 3)["faults"])
    assert mix_options("realistic", 3)["rot"] == 0.25 and full.seed == 3
    assert mix_options("clean", 3) == {"faults": "", "rot": 0.0}
    assert "without rot" in mixes() and len(mixes()) == 2 + len(LEFT_OUT)
    for kind in LEFT_OUT:
        options = mix_options(f"without {kind}", 3)
        faults = parse_faults(options["faults"])
        if kind == "rot":
            assert options["rot"] == 0.0 and faults == full
            continue
        assert options["rot"] == 0.25 and getattr(faults, kind) == 0.0
        others = [f for f in LEFT_OUT if f not in (kind, "rot")]
        assert all(getattr(faults, f) == getattr(full, f) > 0 for f in others)
    with pytest.raises(ValueError, match="unknown row"):
        mix_options("without gremlins", 1)


def test_the_breakdown_and_the_seeded_comparison_print_intervals(tmp_path, capsys):
    arguments = ["fault-breakdown", "--arms", "window_drop", "--stream", "tiny:rules"]
    arguments += ["--seeds", "1,2,3", "--window", "4096", "--rows", "clean,without rot"]
    arguments += ["--out", str(tmp_path / "breakdown"), "--quiet"]
    assert bench_main(arguments) == 0
    printed = capsys.readouterr().out
    assert "each fault left out (simulated reader)" in printed
    assert "| clean | " in printed and "| without rot | " in printed and " ± " in printed
    arguments = ["compare", "--arms", "window_drop", "--stream", "tiny:rules", "--seeds", "1,2,3"]
    arguments += ["--window", "4096", "--out", str(tmp_path / "compare"), "--quiet"]
    assert bench_main(arguments) == 0
    printed = capsys.readouterr().out
    assert "| run | seed 1 | seed 2 | seed 3 | mean ± 95% |" in printed
    assert (tmp_path / "compare" / "seeds.md").exists()
    assert (tmp_path / "compare" / "seed2" / "report.md").exists()
