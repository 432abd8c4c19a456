"""Comparing arms on one stream: one report with score and cost tables and plots; the demo."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from keeper_bench.cli import main as bench_main
from keeper_bench.compare import (
    compare_runs,
    comparison_cost_table,
    parse_arms,
    run_folder_name,
    uncached_prompt_tokens,
)
from keeper_bench.costs import CostSummary
from keeper_bench.run_options import RunOptions, resolve_stream

WINDOW = 3072
"""At 2,048 the default (conservative) counter leaves no room beside the tools, the note
request and the NOTES at their default budget for a question's searches and their results."""


@pytest.fixture(scope="module")
def compared(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("compare")
    arguments = ["compare", "--arms", "notes,window_drop,rag", "--stream", "tiny:rules+overdrawn"]
    arguments += ["--window", str(WINDOW), "--out", str(out), "--quiet"]
    assert bench_main(arguments) == 0
    return out, (out / "report.md").read_text()


def costs(**given) -> CostSummary:
    values = {
        "wall_seconds": 10.0,
        "model_seconds": 4.0,
        "calls": 3,
        "work_calls": 2,
        "management_calls": 1,
        "prompt_tokens": 1000,
        "completion_tokens": 50,
        "cached_tokens": 0,
        "cached_reported_calls": 0,
        "management_tokens": 300,
        "peak_prompt_tokens": 600,
        "prefix_reuse_ratio": 0.5,
        "prefix_reuse_tokens": 700,
    }
    return CostSummary(**{**values, **given})


def test_each_arm_gets_its_own_run_folder_on_the_shared_stream(compared):
    out, _ = compared
    for arm in ("notes", "window_drop", "rag"):
        run = json.loads((out / arm / "run.json").read_text())
        assert (
            run["arm"] == arm
            and (out / arm / run["stream"]).resolve() == (out / "stream").resolve()
        )
        assert (out / arm / "grade.json").exists() and (out / arm / "costs.json").exists()
    assert (out / "notes" / "audit.json").exists()
    assert not (out / "rag" / "audit.json").exists()  # no notes to audit


def test_the_report_has_score_and_cost_tables_labelled_simulated_reader(compared):
    out, report = compared
    assert "### Score by question type (simulated reader)" in report
    assert "### Score by distance back, in batches (simulated reader)" in report
    assert "### Costs (simulated reader)" in report
    for arm in ("notes", "window_drop", "rag"):
        # type table, distance table, whole sets lost, cost table
        assert report.count(f"| {arm} |") == 4
    assert "uncached prompt tok" in report and "wall s excl. model" in report
    assert (out / "score_by_distance.png").stat().st_size > 0
    assert (out / "tokens_per_100k.png").stat().st_size > 0


def test_the_keeper_answers_what_dropping_old_turns_forgets(compared):
    out, _ = compared
    notes = json.loads((out / "notes" / "grade.json").read_text())
    dropped = json.loads((out / "window_drop" / "grade.json").read_text())
    assert notes["right"] == notes["asked"]
    assert dropped["right"] < notes["right"]
    assert dropped["by_category"]["rule"][0] < dropped["by_category"]["rule"][1]


def test_uncached_tokens_come_from_the_server_or_are_marked_as_estimated():
    assert uncached_prompt_tokens(costs(cached_tokens=900, cached_reported_calls=3)) == (100, False)
    assert uncached_prompt_tokens(costs()) == (300, True)
    table = comparison_cost_table([("a", costs())], reader="simulated reader")
    assert "| a | 3 (2 + 1) | 1,000 | ≈300 | 300 | 600 | 10.0 | 6.0 |" in table
    assert "≈: the server reported no cache figures" in table


def test_arm_lists_and_labels_are_checked_before_anything_runs(tmp_path):
    assert parse_arms("notes, rag") == ["notes", "rag"]
    assert "peer_langmem_summarization" in parse_arms("")
    with pytest.raises(ValueError, match="unknown arm"):
        parse_arms("notes,nots")
    stream = resolve_stream("tiny", tmp_path / "stream")
    same = RunOptions.create(arm="notes", stream=stream, window=WINDOW)
    with pytest.raises(ValueError, match="labels must differ"):
        compare_runs([same, same], tmp_path / "out", progress=False)
    assert run_folder_name("rag (hybrid)") == "rag_hybrid"


def test_the_demo_prints_the_tables_what_to_look_for_and_the_plots(tmp_path, capsys):
    arguments = ["demo", "--arms", "notes,rag", "--stream", "tiny:rules+overdrawn"]
    arguments += ["--window", str(WINDOW), "--out", str(tmp_path), "--quiet"]
    assert bench_main(arguments) == 0
    printed = capsys.readouterr().out
    assert "### What to look for (simulated reader)" in printed
    # the rules-free stream of the same size, headlined beside the rules stream
    assert "| run | answerable right, rules stream | rules-free | rule naming nothing" in printed
    assert "rules-free stream `tiny`" in printed
    assert (tmp_path / "rules_free" / "report.md").exists()
    assert f"plot: {tmp_path / 'score_by_distance.png'}" in printed


def test_the_rules_free_stream_drops_only_the_rule_families():
    from keeper_bench.demo import rules_free_stream

    assert rules_free_stream("small:rules+overdrawn") == "small"
    assert rules_free_stream("240k:rules+overdrawn+varied") == "240k:varied"
    assert rules_free_stream("small:varied") is None  # already rules-free
    assert rules_free_stream("runs/some/folder") is None
