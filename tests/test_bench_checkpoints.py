"""The run folder's checkpointer stores each message once and restores what the plain one did."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite import SqliteSaver

from keeper_bench import checkpoints
from keeper_bench.arms.peers import LANGMEM_SUMMARY_TYPE
from keeper_bench.checkpoints import open_checkpointer
from keeper_bench.run_options import RunOptions, resolve_stream
from keeper_bench.runner import run_arm

WINDOW = 4096
TIMING = frozenset({"wall_seconds", "model_seconds", "minutes", "minutes_per_100k"})
SAME_BYTES = ("answers.jsonl", "summaries.jsonl", "grade.json", "audit.json", "notes.jsonl")


def plain_checkpointer(path: Path) -> SqliteSaver:
    """LangGraph's own saver, as the runner opened it before (the reference to compare with)."""
    connection = sqlite3.connect(str(path), check_same_thread=False)
    connection.execute("PRAGMA synchronous=NORMAL")
    serde = JsonPlusSerializer(allowed_msgpack_modules=[LANGMEM_SUMMARY_TYPE])
    return SqliteSaver(connection, serde=serde)


class _PlainSaver(SqliteSaver):
    """The plain saver with the housekeeping the runner asks of its checkpointer."""

    def keep_only_latest(self, thread_id: str) -> None:
        latest = self.get_tuple({"configurable": {"thread_id": thread_id}})
        if latest is None:
            return
        with self.cursor() as cur:
            for table in ("checkpoints", "writes"):
                cur.execute(
                    f"DELETE FROM {table} WHERE thread_id = ? AND checkpoint_id != ?",
                    (thread_id, latest.config["configurable"]["checkpoint_id"]),
                )


def open_plain(path: Path) -> _PlainSaver:
    saver = plain_checkpointer(path)
    return _PlainSaver(saver.conn, serde=saver.serde)


def without_timing(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_timing(v) for k, v in value.items() if k not in TIMING}
    if isinstance(value, list):
        return [without_timing(v) for v in value]
    return value


def results_of(run_dir: Path) -> dict[str, Any]:
    """Everything a run folder reports except how long it took."""
    found: dict[str, Any] = {
        name: (run_dir / name).read_bytes() for name in SAME_BYTES if (run_dir / name).exists()
    }
    found["costs"] = without_timing(json.loads((run_dir / "costs.json").read_text()))
    found["calls"] = [
        without_timing(json.loads(line))
        for line in (run_dir / "calls.jsonl").read_text().splitlines()
    ]
    return found


def stored_messages(run_dir: Path) -> int:
    with sqlite3.connect(run_dir / "checkpoints.sqlite3") as connection:
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master")}
        if "message_blobs" not in tables:
            return 0
        return int(connection.execute("SELECT count(*) FROM message_blobs").fetchone()[0])


@pytest.fixture(scope="module", params=[0, 1, 2])
def stream(request, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp(f"stream{request.param}")
    return resolve_stream("tiny:rules+overdrawn", folder, seed=request.param)


def options(stream: Path, arm: str) -> RunOptions:
    return RunOptions.create(arm=arm, stream=stream, window=WINDOW)


# -- a whole run ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "arm", ["peer_langmem_summarization", "peer_langmem_summarization_tuned", "notes"]
)
def test_a_run_reports_the_same_results_as_with_the_plain_checkpointer(
    stream, tmp_path, monkeypatch, arm
):
    shared = run_arm(options(stream, arm), tmp_path / "shared", progress=False)
    monkeypatch.setattr(checkpoints, "open_checkpointer", open_plain)
    plain = run_arm(options(stream, arm), tmp_path / "plain", progress=False)

    assert results_of(tmp_path / "shared") == results_of(tmp_path / "plain")
    assert shared.grade.to_json() == plain.grade.to_json()
    assert stored_messages(tmp_path / "shared") > 0 and stored_messages(tmp_path / "plain") == 0
    if arm.startswith("peer_langmem"):
        assert (tmp_path / "shared" / "summaries.jsonl").read_text().strip()  # it summarised


def test_a_run_begun_with_the_plain_checkpointer_resumes_to_the_same_results(
    stream, tmp_path, monkeypatch
):
    arm = "peer_langmem_summarization_tuned"
    run_arm(options(stream, arm), tmp_path / "whole", progress=False)

    class StopError(Exception):
        pass

    def stop_after_some(step: Any, _values: Any) -> None:
        if step.index == 12:
            raise StopError

    with monkeypatch.context() as patch:
        patch.setattr(checkpoints, "open_checkpointer", open_plain)
        with pytest.raises(StopError):
            run_arm(
                options(stream, arm), tmp_path / "resumed", progress=False, on_step=stop_after_some
            )
    resumed = run_arm(options(stream, arm), tmp_path / "resumed", progress=False)

    assert resumed.resumed_from_step == 13
    assert results_of(tmp_path / "resumed") == results_of(tmp_path / "whole")


# -- the saver itself ----------------------------------------------------------------------------
def conversation(turns: int) -> list[Any]:
    messages: list[Any] = [SystemMessage("read the stories", id="system")]
    for turn in range(turns):
        messages.append(HumanMessage(f"item {turn}: añadió 3 🍎 " * 50, id=f"human-{turn}"))
        messages.append(AIMessage(f"noted {turn}", id=f"ai-{turn}"))
    return messages


def checkpoint_of(messages: list[Any], number: int) -> dict[str, Any]:
    return {
        "v": 1,
        "id": f"1ef00000-0000-6000-8000-{number:012d}",
        "ts": "2026-11-30T00:00:00+00:00",
        "channel_values": {"messages": messages, "step": number, "note": "kept as it is"},
        "channel_versions": {"messages": number, "step": number, "note": 1},
        "versions_seen": {},
    }


def put(saver: SqliteSaver, messages: list[Any], number: int, thread: str = "t") -> None:
    config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    saver.put(config, checkpoint_of(messages, number), {"step": number}, {})


def latest(saver: SqliteSaver, thread: str = "t") -> dict[str, Any]:
    found = saver.get_tuple({"configurable": {"thread_id": thread}})
    assert found is not None
    return dict(found.checkpoint["channel_values"])


def test_each_message_is_stored_once_however_many_checkpoints_hold_it(tmp_path):
    saver = open_checkpointer(tmp_path / "c.sqlite3")
    for number in range(1, 9):
        put(saver, conversation(number), number)
    stored = saver.conn.execute("SELECT count(*) FROM message_blobs").fetchone()[0]
    assert stored == len(conversation(8))
    biggest = saver.conn.execute("SELECT max(length(checkpoint)) FROM checkpoints").fetchone()[0]
    text = sum(len(str(m.content)) for m in conversation(8))
    assert biggest < text / 4  # the checkpoints hold references, not the text


@pytest.mark.parametrize("turns", [0, 1, 7])
def test_a_checkpoint_restores_what_the_plain_saver_restores(tmp_path, turns):
    shared = open_checkpointer(tmp_path / "shared.sqlite3")
    plain = plain_checkpointer(tmp_path / "plain.sqlite3")
    for saver in (shared, plain):
        put(saver, conversation(turns), 1)
    assert latest(shared) == latest(plain)
    assert latest(shared)["note"] == "kept as it is"


def test_another_process_restores_the_messages_from_the_file(tmp_path):
    put(open_checkpointer(tmp_path / "c.sqlite3"), conversation(5), 1)
    reopened = open_checkpointer(tmp_path / "c.sqlite3")
    assert latest(reopened)["messages"] == conversation(5)


def test_threads_keep_their_own_messages(tmp_path):
    saver = open_checkpointer(tmp_path / "c.sqlite3")
    put(saver, conversation(2), 3, thread="a")
    put(saver, conversation(4), 3, thread="b")  # same channel version, other thread
    assert latest(saver, "a")["messages"] == conversation(2)
    assert latest(saver, "b")["messages"] == conversation(4)


def test_a_checkpoint_written_by_the_plain_saver_is_read_as_written(tmp_path):
    put(plain_checkpointer(tmp_path / "c.sqlite3"), conversation(3), 1)
    assert latest(open_checkpointer(tmp_path / "c.sqlite3"))["messages"] == conversation(3)


def test_only_the_latest_checkpoint_is_kept(tmp_path):
    saver = open_checkpointer(tmp_path / "c.sqlite3")
    for number in range(1, 4):
        put(saver, conversation(number), number)
    saver.keep_only_latest("t")
    rows = saver.conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0]
    assert rows == 1 and latest(saver)["messages"] == conversation(3)


def test_a_damaged_file_is_named_with_the_fix(tmp_path):
    put(open_checkpointer(tmp_path / "c.sqlite3"), conversation(2), 1)
    with sqlite3.connect(tmp_path / "c.sqlite3") as connection:
        connection.execute("DELETE FROM message_blobs WHERE rowid = 1")
    with pytest.raises(ValueError, match=r"missing from message_blobs.*delete the run folder"):
        latest(open_checkpointer(tmp_path / "c.sqlite3"))


def test_the_saver_reads_messages_back_from_the_file_not_from_a_copy_it_kept(tmp_path):
    # a long run writes every message of its stream once: the process must not hold them all
    saver = open_checkpointer(tmp_path / "c.sqlite3")
    put(saver, conversation(3), 1)
    assert latest(saver)["messages"] == conversation(3)
    saver.conn.execute("DELETE FROM message_blobs WHERE rowid = 2")
    saver.conn.commit()
    with pytest.raises(ValueError, match=r"missing from message_blobs"):
        latest(saver)
