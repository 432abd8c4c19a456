"""The comparison matrix: every arm × fault mix × seed, summed fairly, in a README-ready summary."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from keeper_bench.cli import main as bench_main
from keeper_bench.grader import SIMULATED_READER, GradeResult
from keeper_bench.matrix import (
    MatrixSpec,
    faults_text,
    mix_options,
    parse_shard,
    run_matrix,
    shard_cells,
)
from keeper_bench.matrix_report import MatrixRun, headline_table, total_cell

ARMS = ("notes", "summarize")


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    out = tmp_path_factory.mktemp("matrix")
    spec = MatrixSpec(arms=ARMS, sizes=("tiny",), seeds=(1, 2), window=4096)
    runs, summary = run_matrix(spec, out, progress=False)
    return spec, runs, summary, out


def test_every_cell_is_run_once_into_its_own_folder(matrix):
    spec, runs, _, out = matrix
    assert len(runs) == len(spec.cells()) == 2 * 2 * 2
    for run in runs:
        folder = out / "runs" / run.size / run.faults / f"seed{run.seed}" / run.arm
        assert json.loads((folder / "run.json").read_text())["label"] == run.arm
    cells = json.loads((out / "matrix.json").read_text())["runs"]
    assert {(c["faults"], c["seed"], c["arm"]) for c in cells} == {
        (f, s, a) for f in ("none", "realistic") for s in (1, 2) for a in ARMS
    }


def test_the_realistic_mix_reaches_the_reader_with_the_streams_seed(matrix):
    _, _, _, out = matrix
    run = json.loads((out / "runs/tiny/realistic/seed2/notes/run.json").read_text())
    assert run["faults"]["seed"] == 2 and run["faults"]["sign_flip"] > 0
    clean = json.loads((out / "runs/tiny/none/seed2/notes/run.json").read_text())
    assert not any(v for k, v in clean["faults"].items() if k != "seed")


def test_the_summary_has_the_headline_scores_costs_audit_and_plots(matrix):
    _, runs, summary, out = matrix
    assert (out / "README.md").read_text() == summary
    assert summary.count("(simulated reader)") >= 6
    headline = summary.split("#### ")[0]
    assert "| arm | no faults | realistic faults |" in headline
    for arm in ARMS:
        assert f"\n| {arm} |" in headline
    notes = [r for r in runs if r.arm == "notes" and r.faults == "none"]
    expected = total_cell([r.grade for r in notes])
    assert f"| notes | {expected} |" in headline
    for heading in ("Score by question type", "Score by distance back", "Costs, mean per seed"):
        assert summary.count(heading) == 2  # one per fault mix
    audit = summary.split("Memory audit")[1]
    assert "| notes | none | notes |" in audit and "| summarize | none | summary |" in audit
    for png in ("score_by_distance-tiny-none.png", "tokens_per_100k-tiny.png"):
        assert (out / png).read_bytes().startswith(b"\x89PNG") and f"]({png})" in summary


def test_a_finished_matrix_is_read_back_not_run_again(matrix):
    spec, runs, summary, out = matrix
    calls = (out / "runs/tiny/none/seed1/notes/calls.jsonl").read_text()
    again, again_summary = run_matrix(spec, out, progress=False)
    assert (out / "runs/tiny/none/seed1/notes/calls.jsonl").read_text() == calls
    assert [r.grade.right for r in again] == [r.grade.right for r in runs]
    assert again_summary == summary


def grade(right: int, asked: int) -> GradeResult:
    """A grade with only its totals (what the headline reads)."""
    return SimpleNamespace(right=right, asked=asked, reader=SIMULATED_READER)  # type: ignore[return-value]


def test_a_total_sums_the_seeds_and_shows_their_spread():
    assert total_cell([grade(60, 63), grade(63, 63), grade(62, 62)]) == "185/188 (95%–100%)"
    assert total_cell([grade(63, 63), grade(62, 62)]) == "125/125 (100%)"
    assert total_cell([grade(5, 10)]) == "5/10"
    assert total_cell([]) == "–"


def test_the_headline_puts_each_fault_mix_in_its_own_column():
    def run(faults: str, seed: int, right: int) -> MatrixRun:
        return MatrixRun("240k", faults, seed, "notes", grade(right, 10), None, None)

    table = headline_table(
        [run("none", 1, 10), run("none", 2, 9), run("realistic", 1, 7), run("realistic", 2, 8)],
        "240k",
        SIMULATED_READER,
    )
    assert "| notes | 19/20 (90%–100%) | 15/20 (70%–80%) |" in table


@pytest.mark.parametrize(
    ("given", "match"),
    [
        ({"arms": ("trimming",)}, "arms"),
        ({"arms": ARMS, "sizes": ("huge",)}, "sizes"),
        ({"arms": ARMS, "faults": ("awful",)}, "faults"),
        ({"arms": ARMS, "seeds": (1, 1)}, "seeds"),
        ({"arms": ARMS, "model": "openai:http://127.0.0.1:1/v1"}, "simulated reader"),
        ({"arms": ARMS, "rot": 1.5}, "rot"),
    ],
)
def test_a_bad_matrix_is_refused_with_what_to_choose(given, match):
    with pytest.raises(ValueError, match=match):
        MatrixSpec(**given)


def test_fault_mixes_carry_the_seed_and_only_the_realistic_one_has_rot():
    assert faults_text("none", 3) == ""
    assert faults_text("realistic", 3).endswith(",seed=3")
    spec = MatrixSpec(arms=ARMS, rot=0.25)
    assert mix_options(spec, "realistic", 3) == {"faults": faults_text("realistic", 3), "rot": 0.25}
    assert mix_options(spec, "none", 3) == {"faults": ""}
    assert "rot" not in mix_options(MatrixSpec(arms=ARMS), "realistic", 3)


def test_the_command_is_registered(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench_main(["matrix", "--help"])
    assert "--seeds" in capsys.readouterr().out


def test_a_partial_matrix_can_be_summarised_without_running_the_rest(matrix, tmp_path):
    _, runs, _, out = matrix
    wider = MatrixSpec(arms=(*ARMS, "window_drop"), sizes=("tiny",), seeds=(1, 2), window=4096)
    partial, summary = run_matrix(wider, out, progress=False, finished_only=True)
    assert len(partial) == len(runs)
    assert not (out / "runs/tiny/none/seed1/window_drop").exists()
    assert "Not run (left out of every table): tiny seed 1 none window_drop;" in summary


def test_shards_split_the_cells_between_processes_each_exactly_once():
    spec = MatrixSpec(arms=(*ARMS, "rag"), sizes=("tiny", "small"), seeds=(1, 2, 3))
    for count in (1, 2, 3, 5):
        parts = [shard_cells(spec.cells(), (index, count)) for index in range(1, count + 1)]
        assert sorted(cell for part in parts for cell in part) == sorted(spec.cells())
        assert max(map(len, parts)) - min(map(len, parts)) <= 1


@pytest.mark.parametrize("text", ["0/3", "4/3", "2", "a/b", "1/0"])
def test_a_bad_shard_is_refused_with_the_form_it_takes(text):
    with pytest.raises(ValueError, match="I/N"):
        parse_shard(text)


def test_shards_run_in_turn_then_a_finished_only_call_writes_the_whole_matrix(matrix, tmp_path):
    spec, runs, _, _ = matrix
    out = tmp_path / "sharded"
    for index in (1, 2):
        part, text = run_matrix(spec, out, progress=False, shard=(index, 2))
        assert len(part) == len(spec.cells()) // 2 and text.startswith(f"shard {index}/2")
        assert not (out / "README.md").exists()
    whole, whole_summary = run_matrix(spec, out, progress=False, finished_only=True)
    assert [(r.arm, r.faults, r.seed, r.grade.right) for r in whole] == [
        (r.arm, r.faults, r.seed, r.grade.right) for r in runs
    ]
    assert "Not run" not in whole_summary and (out / "README.md").read_text() == whole_summary
