"""Reports and the keeper-bench command: tables and plots always say who answered."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from keeper_bench import cli
from keeper_bench.costs import CallRecord, summarize_costs
from keeper_bench.grader import SIMULATED_READER, grade
from keeper_bench.plots import plot_cost_by_segment, plot_score_by_distance
from keeper_bench.report import (
    cost_table,
    score_table,
)
from keeper_bench.streams import question_sets, read_stream

PNG = b"\x89PNG"


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stream")
    assert (
        cli.main(
            [
                "generate",
                "--families",
                "rules,overdrawn",
                "--size",
                "tiny",
                "--seed",
                "0",
                "--out",
                str(folder),
            ]
        )
        == 0
    )
    return folder


def _run_dir(tmp_path, stream, name, *, wrong_every=0):
    run = tmp_path / name
    run.mkdir()
    (run / "run.json").write_text(
        json.dumps({"stream": str(stream), "reader": SIMULATED_READER, "label": name})
    )
    with (run / "answers.jsonl").open("w") as handle:
        for index, s in enumerate(question_sets(stream)):
            lines = [
                f"{q['number']}. {'nonsense' if wrong_every and index % wrong_every == 0 else q['answer']}"
                for q in s["questions"]
            ]
            handle.write(
                json.dumps(
                    {"after_item": s["after_item"], "final": s["final"], "reply": "\n".join(lines)}
                )
                + "\n"
            )
    with (run / "calls.jsonl").open("w") as handle:
        items = [r["item"] for r in read_stream(stream) if r["type"] == "batch"]
        for i, item in enumerate(items):
            record = CallRecord(
                index=i,
                kind="work" if i % 5 else "notes",
                prompt_tokens=2_000,
                completion_tokens=50,
                cached_tokens=None,
                request_fingerprint=("t", str(i)),
                wall_seconds=1.0,
                model_seconds=0.5,
                item=item,
            )
            handle.write(json.dumps(record.to_json()) + "\n")
    return run


def test_grade_command_scores_a_run_and_writes_grade_json(tmp_path, stream, capsys):
    run = _run_dir(tmp_path, stream, "notes")
    assert cli.main(["grade", str(run)]) == 0
    saved = json.loads((run / "grade.json").read_text())
    assert saved["right"] == saved["asked"] > 0
    assert SIMULATED_READER in capsys.readouterr().out


def test_audit_command_reads_notes_versions(tmp_path, stream, capsys):
    run = _run_dir(tmp_path, stream, "notes")
    text = (
        "[NOTES] Kept by the context keeper. Covers items 1–3.\nRULES\nSTATE\n- nosuch11 = 4\nOPEN"
    )
    (run / "notes.jsonl").write_text(
        json.dumps({"version": 1, "first_item": 1, "last_item": 3, "text": text}) + "\n"
    )
    assert cli.main(["audit", str(run)]) == 0
    audit = json.loads((run / "audit.json").read_text())
    assert audit["counters_ever_wrong"] == ["nosuch11"] and audit["versions_audited"] == 1
    assert "Notes audit (simulated reader)" in capsys.readouterr().out


def test_report_command_writes_tables_and_plots(tmp_path, stream):
    runs = [_run_dir(tmp_path, stream, "notes"), _run_dir(tmp_path, stream, "rag", wrong_every=2)]
    out = tmp_path / "report"
    assert cli.main(["report", *map(str, runs), "--out", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert "| notes |" in report and "| rag |" in report
    assert all(SIMULATED_READER in line for line in report.splitlines() if line.startswith("###"))
    for plot in ("score_by_distance.png", "minutes_by_segment.png"):
        assert (out / plot).read_bytes().startswith(PNG)


def test_a_missing_run_file_is_a_clear_error(tmp_path, capsys):
    assert cli.main(["grade", str(tmp_path)]) == 2
    assert "run.json is missing" in capsys.readouterr().err


def test_score_table_has_one_row_per_run_and_names_the_reader(stream):
    sets = list(question_sets(stream))
    results = [grade(sets, {}, reader=SIMULATED_READER, label=label) for label in ("a", "b")]
    table = score_table(results)
    assert table.count("| a |") == 2 and table.count("| b |") == 2
    assert table.count(f"({SIMULATED_READER})") == 2


def test_cost_table_and_segment_plot(tmp_path):
    record = CallRecord(
        index=0,
        kind="work",
        prompt_tokens=10,
        completion_tokens=1,
        cached_tokens=4,
        request_fingerprint=("t",),
        wall_seconds=6,
        model_seconds=3,
        item=1,
    )
    summary = summarize_costs([record], {1: 150_000})
    table = cost_table([("notes", summary)], reader=SIMULATED_READER)
    assert "### Costs (simulated reader)" in table and "| notes | 0.1 | 1 (1 + 0) |" in table
    assert plot_cost_by_segment(
        [("notes", summary)], tmp_path / "c.png", reader=SIMULATED_READER, metric="tokens"
    ).exists()
    with pytest.raises(ValueError, match="metric"):
        plot_cost_by_segment([], tmp_path / "d.png", reader=SIMULATED_READER, metric="dollars")


def test_score_plot_is_a_png(tmp_path, stream):
    result = grade(list(question_sets(stream)), {}, reader=SIMULATED_READER)
    assert plot_score_by_distance([result], tmp_path / "s.png").read_bytes().startswith(PNG)


def test_registered_commands_appear_in_the_parser():
    def configure(parser):
        parser.add_argument("--x", type=int, default=1)

    cli.register(cli.Command("echo-test", "test only", configure, lambda args: args.x))
    try:
        assert cli.main(["echo-test", "--x", "7"]) == 7
        with pytest.raises(ValueError, match="already registered"):
            cli.register(cli.Command("echo-test", "again", configure, lambda args: 0))
    finally:
        del cli.COMMANDS["echo-test"]


def test_the_module_runs_with_python_dash_m():
    done = subprocess.run(
        [sys.executable, "-m", "keeper_bench.cli", "generate", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "--families" in done.stdout
