"""``notes-cost --repeat N``: the keeper CPU of several runs of a size is their median per tenth
with the spread beside it; the figures the simulated reader fixes must be the same in every run,
or nothing is combined; one run reads exactly as it always did."""

from __future__ import annotations

import json
import random
import re

import pytest

from keeper_bench.notes_cost.command import main, render
from keeper_bench.notes_cost.repeats import (
    RunsDisagreeError,
    combine,
    disagreements,
    last_vs_first,
    median_per_tenth,
    span_per_tenth,
)
from keeper_bench.notes_cost.tenths import render_tenths

BREAKDOWN_COLUMNS = (
    "work_calls",
    "after_search",
    "notes_calls",
    "reasks",
    "notes_per_work_call",
    "work_prompt_avg",
    "notes_prompt_avg",
    "searches",
    "search_tokens",
    "moved",
)
CELL = re.compile(r"^\d+\.\d\d \(\d+\.\d\d–\d+\.\d\d\)$")


def _run(cpu: list[float], *, seed: int = 0, rss: float = 100.0) -> dict:
    """One run's result as the child process reports it; token figures fixed by ``seed``."""
    rng = random.Random(seed)
    tenths = [
        {"prompt": rng.uniform(1e5, 9e5), "uncached": rng.uniform(1e4, 9e4), "keeper_cpu_s": c}
        for c in cpu
    ]
    folded = [{**row, "keeper_cpu_s": row["keeper_cpu_s"] * 1.1} for row in tenths]
    breakdown = [
        {
            **dict.fromkeys(BREAKDOWN_COLUMNS, 0.0),
            "work_calls": float(rng.randint(3, 9)),
            "notes_calls": 1.0,
        }
        for _ in range(11)
    ]
    return {
        "size": "1m",
        "window": 32_768,
        "seconds": 10.0 + sum(cpu),
        "score": "134/134",
        "tenths": tenths,
        "after_stream": {
            "prompt": 900.0,
            "uncached": 90.0,
            "keeper_cpu_s": cpu[0] / 10,
            "calls": 3,
        },
        "folded_tenths": folded,
        "stream_tokens": 1_000_000,
        "totals": {"prompt": 5e6, "uncached": 5e5, "keeper_cpu_s": sum(cpu)},
        "breakdown": breakdown,
        "notes_tokens": 4000,
        "notes_entries": 120,
        "notes_entries_moved": 30,
        "cuts": 79,
        "searches": 40,
        "peak_rss_mb": rss,
    }


def test_the_median_of_each_tenth_and_the_lowest_and_highest_run():
    runs = [[0.50, 0.60, 0.70], [0.55, 0.58, 0.90], [0.40, 0.61, 0.72]]
    assert median_per_tenth(runs) == [0.50, 0.60, 0.72]
    assert span_per_tenth(runs) == [(0.40, 0.55), (0.58, 0.61), (0.70, 0.90)]
    assert median_per_tenth([[1.0, 2.0], [3.0, 6.0]]) == [2.0, 4.0]  # an even count: the mean
    assert median_per_tenth([[0.3, 0.4]]) == [0.3, 0.4]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("count", [2, 3, 5])
def test_a_median_lies_within_its_runs_and_an_odd_count_gives_one_of_them(seed, count):
    rng = random.Random(seed)
    runs = [[rng.uniform(0.1, 1.0) for _ in range(10)] for _ in range(count)]
    for tenth, (median, (low, high)) in enumerate(
        zip(median_per_tenth(runs), span_per_tenth(runs), strict=True)
    ):
        values = [run[tenth] for run in runs]
        assert low == min(values) <= median <= max(values) == high
        if count % 2:
            assert median in values


def test_runs_of_different_lengths_or_none_at_all_are_refused():
    with pytest.raises(ValueError, match="same tenths"):
        median_per_tenth([[0.1, 0.2], [0.1]])
    with pytest.raises(ValueError, match="at least one run"):
        span_per_tenth([])
    with pytest.raises(ValueError, match="1m: combining needs at least one run"):
        combine("1m", [])


def test_last_vs_first_is_a_fraction_and_undefined_from_nothing():
    assert last_vs_first([0.5, 0.9, 0.6]) == pytest.approx(0.2)
    assert last_vs_first([0.0, 0.3]) is None


def test_one_run_is_left_as_it_is_and_its_table_has_no_spread():
    run = _run([0.5] * 9 + [0.6])
    assert combine("1m", [run]) == run
    lines = render_tenths(combine("1m", [run]))
    assert lines == render_tenths(run)
    assert "median" not in "\n".join(lines)
    assert "| 1 | " in lines[2] and lines[2].endswith("| 0.50 |")
    assert "(runs:" not in "\n".join(lines)


@pytest.mark.parametrize("seed", [0, 7])
def test_three_runs_give_the_median_cpu_the_spread_and_each_runs_change(seed):
    cpu = [[0.50] * 9 + [0.60], [0.55] * 9 + [0.62], [0.45] * 9 + [0.70]]
    runs = [
        _run(values, seed=seed, rss=rss) for values, rss in zip(cpu, (110, 130, 120), strict=True)
    ]
    combined = combine("1m", runs)
    assert [row["keeper_cpu_s"] for row in combined["tenths"]] == [0.50] * 9 + [0.62]
    assert [row["prompt"] for row in combined["tenths"]] == [r["prompt"] for r in runs[0]["tenths"]]
    assert combined["repeat"] == 3
    assert combined["peak_rss_mb"] == 130
    assert combined["runs_peak_rss_mb"] == [110, 130, 120]
    spread = combined["keeper_cpu_spread"]
    assert spread["tenths"][0] == (0.45, 0.55)
    assert spread["tenths"][9] == (0.60, 0.70)
    assert spread["last_vs_first_runs"] == pytest.approx([0.2, 0.62 / 0.55 - 1, 0.70 / 0.45 - 1])
    assert combined["after_stream"]["keeper_cpu_s"] == pytest.approx(0.05)
    assert spread["after_stream"] == pytest.approx((0.045, 0.055))
    assert combined["folded_tenths"][9]["keeper_cpu_s"] == pytest.approx(0.62 * 1.1)
    assert combined["totals"]["keeper_cpu_s"] == pytest.approx(
        0.5 * 9 + 0.6
    )  # the middle of 5.10, 5.57, 4.75

    lines = render_tenths(json.loads(json.dumps(combined)))  # as read back from result.json
    assert "median of 3 runs" in lines[0]
    rows = [line.split(" | ") for line in lines if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 10
    assert all(CELL.match(row[-1].removesuffix(" |")) for row in rows)
    assert rows[0][-1] == "0.50 (0.45–0.55) |"
    last = next(line for line in lines if line.startswith("| last vs first"))
    assert last.endswith("| +24% (runs: +20%, +13%, +56%) |")
    assert "| 0.05 s (0.04–0.06) |" in next(line for line in lines if "after the stream" in line)


def test_the_rendered_size_names_every_run_and_the_largest_peak():
    runs = [_run([0.5] * 10, rss=rss) for rss in (110, 130)]
    text = render([combine("1m", runs)])
    assert "2 runs, one after the other:" in text
    assert "Peak RSS of a run's process: 130 MB (the largest of the 2 runs: 110, 130 MB)" in text
    assert "were the same in every run (checked)" in text
    single = render([runs[0]])
    assert "Peak RSS of the run's process: 110 MB." in single and "median" not in single


@pytest.mark.parametrize(
    ("figure", "change"),
    [
        ("tenth 3 prompt tok / 100K", lambda r: r["tenths"][2].update(prompt=1.0)),
        ("tenth 10 uncached tok / 100K", lambda r: r["tenths"][9].update(uncached=2.0)),
        ("score", lambda r: r.update(score="133/134")),
        ("cuts", lambda r: r.update(cuts=80)),
        ("breakdown tenth 4 notes_calls", lambda r: r["breakdown"][3].update(notes_calls=2.0)),
        ("after the stream calls", lambda r: r["after_stream"].update(calls=4)),
    ],
)
def test_runs_that_disagree_on_a_fixed_figure_are_not_combined(figure, change):
    runs = [_run([0.5] * 10), _run([0.6] * 10), _run([0.55] * 10)]
    change(runs[1])
    assert [item.figure for item in disagreements(runs)] == [figure]
    with pytest.raises(RunsDisagreeError) as raised:
        combine("1m", runs)
    message = str(raised.value)
    assert message.startswith("notes-cost 1m: the 3 runs disagree on 1 figure(s)")
    assert figure in message
    assert "run 1 " in message and "run 2 " in message and "run 3 " in message
    assert "not deterministic" in message


def test_the_keeper_cpu_time_and_memory_may_differ_between_runs():
    runs = [_run([0.5] * 10, rss=100), _run([0.7] * 10, rss=140)]
    runs[1]["seconds"] = 99.0
    assert disagreements(runs) == []


@pytest.mark.parametrize("bad", ["0", "-2", "two", "1.5"])
def test_repeat_must_be_a_whole_number_of_one_or_more(bad, tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--sizes", "tiny", "--repeat", bad, "--work", str(tmp_path)])
    assert exited.value.code == 2
    assert "--repeat is how many runs of each size, a whole number of 1 or more" in (
        capsys.readouterr().err
    )
    assert not any(tmp_path.iterdir())


def test_two_real_runs_agree_and_report_the_median_with_its_spread(tmp_path, capsys):
    work, out = tmp_path / "work", tmp_path / "notes_cost.md"
    assert main(["--sizes", "tiny", "--repeat", "2", "--work", str(work), "--out", str(out)]) == 0
    folder = work / "harder-tiny-seed0"
    runs = [json.loads((folder / f"run{n}" / "result.json").read_text()) for n in (1, 2)]
    assert disagreements(runs) == []
    combined = json.loads((folder / "result.json").read_text())
    assert combined["repeat"] == 2
    for number, row in enumerate(combined["tenths"]):
        values = [run["tenths"][number]["keeper_cpu_s"] for run in runs]
        assert row["keeper_cpu_s"] == pytest.approx(sum(values) / 2)
    assert combined["peak_rss_mb"] == max(run["peak_rss_mb"] for run in runs)
    for number, row in enumerate(combined["phases"]):
        for phase, seconds in row.items():
            values = [run["phases"][number][phase] for run in runs]
            assert seconds == pytest.approx(sum(values) / 2)

    table = out.read_text(encoding="utf-8")
    cost, _, by_phase = table.partition("The keeper's CPU by phase")
    assert "(median of 2 runs, phase by phase)" in by_phase
    rows = [line for line in cost.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [row.split(" | ")[0] for row in rows] == [f"| {n}" for n in range(1, 11)]
    assert all(CELL.match(row.split(" | ")[-1].removesuffix(" |")) for row in rows)
    assert re.search(r"\| last vs first \|.*\(runs: [+-]\d+%, [+-]\d+%\) \|", cost)
    assert "median of 2 runs" in cost
    assert not (folder / "run").exists()

    capsys.readouterr()
    assert main(["--explain", str(work)]) == 0
    explained = capsys.readouterr().out
    assert "### harder-tiny-seed0/run1" in explained and "### harder-tiny-seed0/run2" in explained
    with pytest.raises(ValueError, match="already holds runs"):
        main(["--sizes", "tiny", "--repeat", "2", "--work", str(work)])
