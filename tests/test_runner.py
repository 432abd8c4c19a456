"""The benchmark runner: what a run folder holds, how batches arrive, and resuming after a kill."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from keeper_bench.cli import main as bench_main
from keeper_bench.reader import REALISTIC_FAULTS, ContextRot, SimulatedReader
from keeper_bench.reader.faults import ReaderFaults
from keeper_bench.recording import call_kind, request_fingerprint
from keeper_bench.run_folder import prepare_run_dir
from keeper_bench.run_options import (
    RunOptions,
    make_model,
    parse_faults,
    parse_model,
    resolve_stream,
)
from keeper_bench.runner import run_arm
from keeper_bench.steps import CONTINUE_TOOL, TASK_MESSAGES, TASK_TOOL, plan_steps
from keeper_bench.streams import read_stream
from keeper_middleware.messages.facts import keeper_message

WINDOW = 4096


@pytest.fixture(scope="module")
def stream(tmp_path_factory) -> Path:
    return resolve_stream("tiny:rules+overdrawn", tmp_path_factory.mktemp("stream"))


@pytest.fixture(scope="module")
def whole_runs(stream, tmp_path_factory) -> dict[str, Path]:
    """One uninterrupted run per delivery, shared by the tests that only read them."""
    folder = tmp_path_factory.mktemp("whole")
    for delivery in ("messages", "tool"):
        run_arm(options(stream, delivery=delivery), folder / delivery, progress=False)
    return {"messages": folder / "messages", "tool": folder / "tool"}


def options(stream: Path, **given) -> RunOptions:
    return RunOptions.create(**{"arm": "notes", "stream": stream, "window": WINDOW, **given})


def answers(run_dir: Path) -> list[tuple[int, bool, str]]:
    lines = (run_dir / "answers.jsonl").read_text().splitlines()
    return sorted((r["after_item"], r["final"], r["reply"]) for r in map(json.loads, lines))


def notes_texts(run_dir: Path) -> list[str]:
    return [json.loads(line)["text"] for line in (run_dir / "notes.jsonl").read_text().splitlines()]


# -- planning and parsing -----------------------------------------------------------------------
def test_messages_delivery_sends_the_task_then_each_record_as_it_comes(stream):
    records = list(read_stream(stream))
    steps = list(plan_steps(records, "messages"))
    assert steps[0].message == TASK_MESSAGES
    assert [s.message for s in steps[1:]] == [r["text"] for r in records]
    assert [s.question is not None for s in steps[1:]] == [
        r["type"] == "questions" for r in records
    ]
    assert all(not s.batches for s in steps)


def test_tool_delivery_reads_the_batches_between_question_sets_through_the_tool(stream):
    records = list(read_stream(stream))
    steps = list(plan_steps(records, "tool"))
    reading = [s for s in steps if s.question is None]
    assert reading[0].message == TASK_TOOL
    assert {s.message for s in reading[1:]} == {CONTINUE_TOOL}
    served = [text for s in reading for text in s.batches]
    assert served == [r["text"] for r in records if r["type"] == "batch"]
    questions = [s.question for s in steps if s.question is not None]
    assert questions == [r for r in records if r["type"] == "questions"]
    assert [s.index for s in steps] == list(range(len(steps)))


def test_model_and_fault_specs_are_parsed_or_refused_with_the_fix():
    assert parse_model("sim") == ("sim", None)
    assert parse_model("openai:http://127.0.0.1:8080/v1") == ("http://127.0.0.1:8080/v1", None)
    assert parse_model("openai:http://h:8080/v1:qwen3:4b") == ("http://h:8080/v1", "qwen3:4b")
    assert parse_model("openai:https://h/v1:Qwen/Qwen3-4B") == ("https://h/v1", "Qwen/Qwen3-4B")
    with pytest.raises(ValueError, match="openai:URL"):
        parse_model("gpt-4o")
    assert parse_faults("sign_flip=0.05, seed=3") == ReaderFaults(sign_flip=0.05, seed=3)
    with pytest.raises(ValueError, match="known: sign_flip"):
        parse_faults("typo=0.1")
    with pytest.raises(ValueError, match="rate between 0 and 1"):
        parse_faults("sign_flip=2")


def test_the_reader_of_a_run_has_its_faults_rot_and_a_summary_budget_from_the_window(stream):
    run = options(stream, faults="realistic,seed=2", rot=0.25, window=16_384)
    reader = make_model(run)
    assert isinstance(reader, SimulatedReader)
    assert reader.faults == replace(REALISTIC_FAULTS, seed=2)
    assert reader.rot == ContextRot(rate=0.25, seed=2)
    assert reader.summary_tokens == 16_384 // 8
    assert run.run_json(Path("."))["rot"] == 0.25
    with pytest.raises(ValueError, match="rot must be a rate"):
        options(stream, rot=1.5)
    with pytest.raises(ValueError, match="only apply to the simulated reader"):
        options(stream, model="openai:http://127.0.0.1:9/v1", rot=0.1)


def test_a_run_folder_written_before_context_rot_resumes_as_rot_zero(stream, tmp_path):
    run = options(stream)
    prepare_run_dir(run, tmp_path)
    recorded = json.loads((tmp_path / "run.json").read_text())
    del recorded["rot"]
    (tmp_path / "run.json").write_text(json.dumps(recorded))
    prepare_run_dir(run, tmp_path)  # the same run: no error
    with pytest.raises(ValueError, match="differs in rot"):
        prepare_run_dir(options(stream, rot=0.25), tmp_path)


def test_faults_are_refused_for_a_real_model(stream):
    with pytest.raises(ValueError, match="only apply to the simulated reader"):
        options(stream, model="openai:http://127.0.0.1:9/v1", faults="sign_flip=0.1")


# -- recording ----------------------------------------------------------------------------------
def test_call_kinds_come_from_the_keeper_tag_or_a_summary_request():
    assert call_kind([HumanMessage("Item 3.")]) == "work"
    assert call_kind([keeper_message("[RULES] ...", "rules")]) == "work"
    assert call_kind([keeper_message("[NOTES REQUEST] ...", "notes_request")]) == "notes"
    assert call_kind([keeper_message("[NOTES CHECK] ...", "notes_reask")]) == "reask"
    assert call_kind([HumanMessage("[SUMMARY REQUEST] Summarise the conversation.")]) == "summary"


def test_a_fingerprint_shares_its_prefix_with_the_call_that_came_before():
    system = SystemMessage("s")
    first = request_fingerprint([system, HumanMessage("a", id="1")], tools=[{"n": 1}])
    second = request_fingerprint(
        [system, HumanMessage("a", id="1"), AIMessage("b")], tools=[{"n": 1}]
    )
    other_tools = request_fingerprint([system, HumanMessage("a")], tools=[{"n": 2}])
    assert second[: len(first)] == first and len(second) == 3
    assert other_tools[0] != first[0] and other_tools[1] == first[1]


def test_the_recorder_sees_the_keepers_note_calls_made_inside_the_graph(whole_runs):
    run_dir = whole_runs["messages"]
    calls = [json.loads(line) for line in (run_dir / "calls.jsonl").read_text().splitlines()]
    counters = json.loads((run_dir / "keeper_counters.json").read_text())
    kinds = [c["kind"] for c in calls]
    assert kinds.count("work") == counters["model_calls"]
    assert kinds.count("notes") + kinds.count("reask") == counters["notes_calls"] > 0
    assert [c["index"] for c in calls] == list(range(len(calls)))
    assert json.loads((run_dir / "costs.json").read_text())["calls"] == len(calls)


# -- the run folder -----------------------------------------------------------------------------
def test_a_run_folder_is_graded_audited_and_costed_and_the_cli_reads_it(whole_runs, capsys):
    run_dir = whole_runs["messages"]
    for name in ("run.json", "answers.jsonl", "notes.jsonl", "calls.jsonl", "archive.sqlite3"):
        assert (run_dir / name).exists(), name
    for name in ("grade.json", "audit.json", "costs.json"):
        assert json.loads((run_dir / name).read_text())
    run = json.loads((run_dir / "run.json").read_text())
    assert run["reader"] == "simulated reader" and run["label"] == "notes"
    grade = json.loads((run_dir / "grade.json").read_text())
    assert grade["right"] == grade["asked"]  # the simulated reader keeps up at this size
    assert json.loads((run_dir / "audit.json").read_text())["versions_audited"] >= 1
    assert bench_main(["grade", str(run_dir)]) == 0
    assert bench_main(["audit", str(run_dir)]) == 0
    assert "simulated reader" in capsys.readouterr().out


@pytest.mark.parametrize("arm", ["summarize", "peer_langmem_summarization_tuned"])
def test_the_summaries_an_arm_writes_are_saved_and_audited_like_notes(stream, tmp_path, arm):
    result = run_arm(options(stream, arm=arm), tmp_path / arm, progress=False)
    saved = [
        json.loads(line) for line in (tmp_path / arm / "summaries.jsonl").read_text().splitlines()
    ]
    calls = [json.loads(line) for line in (tmp_path / arm / "calls.jsonl").read_text().splitlines()]
    assert len(saved) == sum(c["kind"] == "summary" for c in calls) >= 1
    assert [s["version"] for s in saved] == list(range(1, len(saved) + 1))
    assert all(s["kind"] == "summary" and s["text"].strip() for s in saved)
    last_items = [s["last_item"] for s in saved]
    assert last_items == sorted(last_items) and last_items[0] >= 1
    assert result.audit is not None and result.audit["memory"] == "summary"
    assert result.audit["versions_audited"] == len(saved)
    assert result.audit["total_lines"] > 0
    assert not (tmp_path / arm / "notes.jsonl").exists()


def test_an_arm_that_keeps_no_memory_has_nothing_to_audit(stream, tmp_path, capsys):
    result = run_arm(options(stream, arm="window_drop"), tmp_path / "drop", progress=False)
    assert result.audit is None and not (tmp_path / "drop" / "audit.json").exists()
    assert bench_main(["audit", str(tmp_path / "drop")]) == 2
    assert "kept no memory" in capsys.readouterr().err


def test_a_finished_run_is_not_run_again(stream, whole_runs):
    before = (whole_runs["messages"] / "calls.jsonl").read_text()
    again = run_arm(options(stream), whole_runs["messages"], progress=False)
    assert (whole_runs["messages"] / "calls.jsonl").read_text() == before
    assert again.grade.right == again.grade.asked


def test_a_folder_holding_a_different_run_is_refused(stream, whole_runs):
    with pytest.raises(ValueError, match="holds a different run"):
        run_arm(options(stream, window=WINDOW * 2), whole_runs["messages"], progress=False)


def test_tool_delivery_answers_like_message_delivery_with_the_simulated_reader(whole_runs):
    by_message = json.loads((whole_runs["messages"] / "grade.json").read_text())
    by_tool = json.loads((whole_runs["tool"] / "grade.json").read_text())
    assert by_tool["right"] == by_message["right"] == by_message["asked"]
    work = {
        delivery: (whole_runs[delivery] / "calls.jsonl").read_text().count('"kind": "work"')
        for delivery in whole_runs
    }
    assert work["tool"] > work["messages"]  # one call per batch read, and one after the last


# -- resuming -----------------------------------------------------------------------------------
KILLED_RUN = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from keeper_bench import recording
    from keeper_bench.run_options import RunOptions
    from keeper_bench.runner import run_arm

    stream, run_dir, delivery = sys.argv[1], sys.argv[2], sys.argv[3]
    window, kill_at = int(sys.argv[4]), int(sys.argv[5])
    seen = []
    original = recording.CallRecorder.on_llm_end

    def on_llm_end(self, response, **kwargs):
        original(self, response, **kwargs)
        seen.append(1)
        if len(seen) == kill_at:  # in the middle of a step: the reply came, nothing used it yet
            os.kill(os.getpid(), signal.SIGKILL)

    recording.CallRecorder.on_llm_end = on_llm_end
    options = RunOptions.create(arm="notes", stream=Path(stream), window=window, delivery=delivery)
    run_arm(options, run_dir, progress=False)
    """
)


@pytest.mark.parametrize(
    ("delivery", "kill_at"),
    [("messages", 28), ("tool", 31)],
)
def test_a_run_killed_mid_step_resumes_to_the_same_answers_and_notes(
    stream, whole_runs, tmp_path, delivery, kill_at
):
    whole = whole_runs[delivery]
    script = tmp_path / "killed_run.py"
    script.write_text(KILLED_RUN)
    arguments = [str(stream), str(tmp_path / "resumed"), delivery, str(WINDOW), str(kill_at)]
    killed = subprocess.run(
        [sys.executable, str(script), *arguments],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    progress = json.loads((tmp_path / "resumed" / "progress.json").read_text())
    assert not progress["finished"] and progress["steps_done"] > 0

    resumed = run_arm(options(stream, delivery=delivery), tmp_path / "resumed", progress=False)

    assert resumed.resumed_from_step == progress["steps_done"]
    assert answers(tmp_path / "resumed") == answers(whole)
    assert notes_texts(tmp_path / "resumed") == notes_texts(whole)
    assert resumed.grade.to_json() == json.loads((whole / "grade.json").read_text())
