"""Indexing off the step's path: a cut commits and the step returns; the process's one worker
embeds the passages; a search right after a cut still finds them; close and exit drain the
queue; a crash loses nothing (the index catches up from the archive)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from keeper_middleware import Keeper, KeeperConfig, create_keeper_agent
from keeper_middleware.retrievers import EmbeddingRetriever, HashingEmbedder, HybridRetriever
from keeper_middleware.retrievers.background import BackgroundWorker, background_worker
from keeper_middleware.retrievers.keyword import KeywordRetriever
from keeper_middleware.search.indexing import INDEXED_SEQ, turn_passages
from tests.fake_model import ScriptedChatModel
from tests.story_model import StoryModel, batch

CONFIG = KeeperConfig(window=4096, reply_reserve=256, notes_every_items=3)
ROOT = Path(__file__).resolve().parents[1]


class Gate:
    """A job that holds the process's worker until opened: whatever is submitted after it waits."""

    def __init__(self) -> None:
        self.opened = threading.Event()
        self.holding = threading.Event()

    def __call__(self) -> None:
        self.holding.set()
        self.opened.wait(30)


@pytest.fixture
def held_worker() -> Iterator[Gate]:
    gate = Gate()
    background_worker().submit(gate, gate)
    assert gate.holding.wait(10)
    try:
        yield gate
    finally:
        gate.opened.set()
        background_worker().drain()


class GatedEmbedder:
    """The hashing embedder, made to wait at every call until the test lets it go on."""

    name = "hashing-384"

    def __init__(self) -> None:
        self.go = threading.Event()
        self.waiting = threading.Event()
        self._inner = HashingEmbedder()

    def __call__(self, texts: list[str]) -> list[list[float]]:
        self.waiting.set()
        assert self.go.wait(30), "the test never let the embedder go on"
        return self._inner(texts)


def agent_on(keeper: Keeper, thread: str = "t1"):
    agent = create_keeper_agent(
        ScriptedChatModel(default=StoryModel()), keeper=keeper, checkpointer=InMemorySaver()
    )
    config = {"configurable": {"thread_id": thread}}
    agent.invoke({"messages": [HumanMessage("Task: read. Rule: keep it exact.")]}, config)
    return agent, config


def read_until_cut(keeper: Keeper, agent, config, items: range, thread: str = "t1") -> None:
    for i in items:
        agent.invoke(
            {"messages": [HumanMessage(batch(i, f"Today we set c{i} to {i * 3}."))]}, config
        )
    assert keeper.counters(thread).cuts >= 1


def expected_passages(keeper: Keeper, session: str) -> int:
    position = 0
    for turn in keeper.archive.turns(session):
        position += len(turn_passages(turn, keeper.config.passages, position))
    return position


def test_a_step_with_a_cut_returns_while_its_passages_are_still_being_embedded():
    embedder = GatedEmbedder()
    keeper = Keeper(
        CONFIG, retriever=HybridRetriever(KeywordRetriever(), EmbeddingRetriever(embedder=embedder))
    )
    try:
        agent, config = agent_on(keeper)
        read_until_cut(keeper, agent, config, range(1, 5))  # cut; the model calls no search
        assert embedder.waiting.wait(10)  # the worker is embedding the cut's passages...
        assert keeper.archive.get_value("t1", INDEXED_SEQ) is None  # ...and nothing is settled
        embedder.go.set()
        keeper.indexing.drain()
        assert keeper.retriever.count("t1") == expected_passages(keeper, "t1") > 0
        assert keeper.archive.get_value("t1", INDEXED_SEQ) == keeper.archive.turn_count("t1") - 1
    finally:
        embedder.go.set()
        keeper.close()


def test_a_hybrid_search_before_the_vectors_are_made_ranks_the_new_passages_by_keyword(
    held_worker,
):
    embedding = EmbeddingRetriever(embedder=HashingEmbedder())
    hybrid = HybridRetriever(KeywordRetriever(), embedding, wait_for_vectors=False)
    keeper = Keeper(CONFIG, retriever=hybrid)
    try:
        agent, config = agent_on(keeper)
        read_until_cut(keeper, agent, config, range(1, 5))
        found = keeper.search("t1", "c2")
        assert "item 2:" in found  # by its keyword side...
        assert embedding.search_written("c2", session="t1") == []  # ...no vector is written yet
        assert not held_worker.opened.is_set()
        held_worker.opened.set()
        keeper.indexing.drain()
        assert embedding.search_written("c2", session="t1")  # written in the background
    finally:
        held_worker.opened.set()
        keeper.close()


def test_a_search_right_after_a_cut_finds_its_passages_without_waiting_for_the_worker(
    held_worker,
):
    keeper = Keeper(CONFIG, retriever=EmbeddingRetriever(embedder=HashingEmbedder()))
    try:
        agent, config = agent_on(keeper)
        read_until_cut(keeper, agent, config, range(1, 5))
        assert keeper.indexing.pending() == 1  # queued behind the job holding the worker
        assert keeper.retriever.count("t1") == 0
        found = keeper.search("t1", "c1")
        assert found.startswith("Found") and "item 1:" in found
        assert not held_worker.opened.is_set()  # the search ran its own session's catch-up
        assert keeper.retriever.count("t1") == expected_passages(keeper, "t1")
    finally:
        held_worker.opened.set()
        keeper.close()


@pytest.mark.real_model
def test_once_its_vectors_are_written_the_hybrid_finds_a_turn_by_its_meaning():
    keeper = Keeper(CONFIG, retriever="hybrid")
    try:
        agent, config = agent_on(keeper)
        agent.invoke(
            {"messages": [HumanMessage("Item 1. The kitten slept all afternoon on the sofa.")]},
            config,
        )
        read_until_cut(keeper, agent, config, range(2, 6))
        assert not keeper.retriever.waits_for_vectors  # the keeper's own hybrid does not wait
        keeper.indexing.drain()
        found = keeper.search("t1", "a small cat napping on the couch")
        assert "item 1:" in found  # no word in common: only the vectors find it
    finally:
        keeper.close()


def test_close_indexes_what_is_still_queued(held_worker, tmp_path):
    archive = tmp_path / "archive.sqlite3"
    keeper = Keeper(CONFIG, archive=archive)
    agent, config = agent_on(keeper)
    read_until_cut(keeper, agent, config, range(1, 5))
    assert keeper.indexing.pending() == 1
    keeper.close()  # the worker is still held: close indexes the queue itself
    assert not held_worker.opened.is_set()
    index = KeywordRetriever(archive.with_suffix(".index") / "keyword.sqlite3")
    reopened = Keeper(CONFIG, archive=archive)
    try:
        assert index.count("t1") == expected_passages(reopened, "t1") > 0
        assert (
            reopened.archive.get_value("t1", INDEXED_SEQ) == reopened.archive.turn_count("t1") - 1
        )
    finally:
        index.close()
        reopened.close()


SCRIPT = """
import sys, threading, time, os
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from keeper_middleware import Keeper, KeeperConfig, create_keeper_agent
from keeper_middleware.retrievers.background import background_worker
from tests.fake_model import ScriptedChatModel
from tests.story_model import StoryModel, batch

archive, ending = sys.argv[1], sys.argv[2]
held = threading.Event()
release = threading.Event()
def gate():
    held.set()
    release.wait(1.0 if ending == "exit" else 600)
background_worker().submit("gate", gate)
held.wait(10)
keeper = Keeper(KeeperConfig(window=4096, reply_reserve=256, notes_every_items=3), archive=archive)
agent = create_keeper_agent(
    ScriptedChatModel(default=StoryModel()), keeper=keeper, checkpointer=InMemorySaver()
)
config = {"configurable": {"thread_id": "t1"}}
agent.invoke({"messages": [HumanMessage("Task: read. Rule: keep it exact.")]}, config)
for i in range(1, 5):
    agent.invoke({"messages": [HumanMessage(batch(i, f"Today we set c{i} to {i * 3}."))]}, config)
assert keeper.counters("t1").cuts >= 1 and keeper.indexing.pending() == 1
print("cut made, its indexing queued", flush=True)
if ending == "crash":
    os._exit(3)  # no close, no exit handlers: the queue is lost with the process
"""


def run_script(archive: Path, ending: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), str(archive), ending],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_a_process_that_exits_without_closing_indexes_its_queue_first(tmp_path):
    archive = tmp_path / "archive.sqlite3"
    done = run_script(archive, "exit")
    assert done.returncode == 0, done.stderr
    assert "queued" in done.stdout
    index = KeywordRetriever(archive.with_suffix(".index") / "keyword.sqlite3")
    keeper = Keeper(CONFIG, archive=archive)
    try:
        assert keeper.archive.get_value("t1", INDEXED_SEQ) == keeper.archive.turn_count("t1") - 1
        assert index.count("t1") == expected_passages(keeper, "t1") > 0
    finally:
        index.close()
        keeper.close()


def test_a_crash_with_indexing_queued_loses_nothing_once_reopened(tmp_path):
    archive = tmp_path / "archive.sqlite3"
    done = run_script(archive, "crash")
    assert done.returncode == 3, done.stderr
    assert "queued" in done.stdout
    keeper = Keeper(CONFIG, archive=archive)
    try:
        assert keeper.archive.get_value("t1", INDEXED_SEQ) is None  # nothing was indexed
        assert keeper.archive.turn_count("t1") > 0
        found = keeper.search("t1", "c2")  # the first search catches the index up
        assert "item 2:" in found
        assert keeper.retriever.count("t1") == expected_passages(keeper, "t1")
        keeper.search("t1", "c3")  # and nothing is indexed twice
        assert keeper.retriever.count("t1") == expected_passages(keeper, "t1")
    finally:
        keeper.close()


def test_a_session_reopened_after_a_crash_is_caught_up_by_its_first_step(tmp_path):
    archive = tmp_path / "archive.sqlite3"
    assert run_script(archive, "crash").returncode == 3
    keeper = Keeper(CONFIG, archive=archive)
    try:
        agent = create_keeper_agent(
            ScriptedChatModel(default=StoryModel()), keeper=keeper, checkpointer=InMemorySaver()
        )
        agent.invoke(
            {"messages": [HumanMessage("Task: read on.")]}, {"configurable": {"thread_id": "t1"}}
        )
        keeper.indexing.drain()
        assert keeper.retriever.count("t1") == expected_passages(keeper, "t1") > 0
    finally:
        keeper.close()


def test_eight_sessions_cutting_at_once_are_each_indexed_once():
    keeper = Keeper(CONFIG, retriever=EmbeddingRetriever(embedder=HashingEmbedder()))
    errors: list[BaseException] = []

    def run(thread: str) -> None:
        try:
            agent, config = agent_on(keeper, thread)
            read_until_cut(keeper, agent, config, range(1, 8), thread)
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(f"s{n}",)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    try:
        assert not errors
        keeper.indexing.drain()
        for n in range(8):
            assert keeper.retriever.count(f"s{n}") == expected_passages(keeper, f"s{n}") > 0
            hits = keeper.retriever.search("c2", session=f"s{n}")
            assert hits and all(h.passage.session == f"s{n}" for h in hits)
    finally:
        keeper.close()


def test_a_forgotten_session_is_not_indexed_again_by_its_queued_catch_up(held_worker):
    keeper = Keeper(CONFIG)
    try:
        agent, config = agent_on(keeper)
        read_until_cut(keeper, agent, config, range(1, 5))
        assert keeper.indexing.pending() == 1
        keeper.forget("t1")
        assert keeper.indexing.pending() == 0
        held_worker.opened.set()
        background_worker().drain()
        assert keeper.retriever.count("t1") == 0
        assert keeper.archive.get_value("t1", INDEXED_SEQ) is None
    finally:
        keeper.close()


# ----------------------------------------------------------------- the worker itself


def test_the_worker_thread_is_not_started_by_importing_the_library():
    code = (
        "import threading, keeper_middleware, keeper_middleware.retrievers;"
        "import keeper_middleware.search.indexing;"
        "print(sorted(t.name for t in threading.enumerate()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "keeper-indexer" not in done.stdout


def test_a_job_submitted_again_while_queued_runs_once():
    worker = BackgroundWorker(name="test-worker")
    gate = Gate()
    runs: list[str] = []
    worker.submit("gate", gate)
    assert gate.holding.wait(10)
    for _ in range(3):
        worker.submit("job", lambda: runs.append("job"))
    gate.opened.set()
    worker.drain()
    assert runs == ["job"]


def test_run_now_runs_a_queued_job_in_the_callers_thread():
    worker = BackgroundWorker(name="test-worker")
    gate = Gate()
    ran_in: list[str] = []
    worker.submit("gate", gate)
    assert gate.holding.wait(10)
    worker.submit("job", lambda: ran_in.append(threading.current_thread().name))
    worker.run_now("job")
    assert ran_in == [threading.current_thread().name]
    gate.opened.set()
    worker.drain()
    assert ran_in == [threading.current_thread().name]  # not run a second time


def test_a_full_queue_makes_the_submitter_wait_for_room():
    worker = BackgroundWorker(max_queued=1, name="test-worker")
    gate = Gate()
    worker.submit("gate", gate)
    assert gate.holding.wait(10)
    worker.submit("first", lambda: None)
    submitted = threading.Event()
    waiter = threading.Thread(
        target=lambda: (worker.submit("second", lambda: None), submitted.set())
    )
    waiter.start()
    time.sleep(0.2)
    assert not submitted.is_set()  # bounded: no room until the worker takes a job
    gate.opened.set()
    assert submitted.wait(10)
    waiter.join(10)
    worker.drain()
    assert worker.pending == 0


def test_a_failing_job_is_logged_and_the_worker_goes_on(caplog):
    worker = BackgroundWorker(name="test-worker")
    done = threading.Event()

    def broken() -> None:
        raise OSError("disk full")

    worker.submit("broken", broken)
    worker.submit("next", done.set)
    assert done.wait(10)
    worker.drain()
    assert "disk full" in caplog.text


def test_every_keeper_and_index_of_a_process_shares_one_indexing_thread():
    keepers = [
        Keeper(CONFIG, retriever=EmbeddingRetriever(embedder=HashingEmbedder())) for _ in range(3)
    ]
    try:
        for n, keeper in enumerate(keepers):
            agent, config = agent_on(keeper, f"k{n}")
            read_until_cut(keeper, agent, config, range(1, 5), f"k{n}")
        for keeper in keepers:
            keeper.indexing.drain()
        names = [t.name for t in threading.enumerate()]
        assert names.count("keeper-indexer") == 1
        assert "keeper-embedder" not in names  # the indexes start no thread of their own
    finally:
        for keeper in keepers:
            keeper.close()


def test_an_index_whose_queue_is_full_writes_before_the_add_returns(held_worker, monkeypatch):
    from keeper_middleware.retrievers import embedding as embedding_module
    from keeper_middleware.retrievers.base import Passage

    monkeypatch.setattr(embedding_module, "MAX_QUEUED_PASSAGES", 4)
    index = EmbeddingRetriever(embedder=HashingEmbedder())
    try:
        index.add([Passage("s", 1, n, f"domo{n} was set to {n}.") for n in range(3)])
        assert index.search_written("domo1", session="s") == []  # queued: the worker is held
        index.add([Passage("s", 1, n, f"domo{n} was set to {n}.") for n in range(3, 6)])
        assert index.search_written("domo5", session="s")  # past the bound: written at once
        assert not held_worker.opened.is_set()
    finally:
        held_worker.opened.set()
        index.close()


def test_a_forked_branch_finds_its_newest_cut_before_the_worker_has_saved_its_progress(
    held_worker,
):
    """On a forked thread a search is limited to the branch's passages; those of the branch's
    newest cut are found while their indexing's progress is still unsaved (the worker is busy)."""
    from tests.branch_runs import make_run
    from tests.test_branches_graph import COMMON, LEFT, QUESTION, RIGHT, completed_after

    held_worker.opened.set()  # the left branch is indexed and settled as usual
    run = make_run("agent", InMemorySaver())
    for text, msg_id in [*COMMON, *LEFT, QUESTION]:
        run.say(text, msg_id=msg_id)
    run.keeper.indexing.drain()
    before = completed_after(run, "item-5")
    gate = Gate()
    background_worker().submit(gate, gate)  # hold the worker again: nothing settles now
    assert gate.holding.wait(10)
    try:
        config = before.config
        for text, msg_id in RIGHT:
            run.say(text, config, msg_id=msg_id)
            config = None
        assert (
            run.keeper.archive.get_value("t", INDEXED_SEQ) < run.keeper.archive.turn_count("t") - 1
        )  # the right branch's progress is not saved yet
        head = run.head()
        found = [h.passage.text for h in run.keeper.retrieve("t", "omega", head=head)]
        assert any("omega" in text for text in found)
        assert not [
            h for h in run.keeper.retrieve("t", "zeta", head=head) if "zeta" in h.passage.text
        ]  # said only on the branch left behind
    finally:
        gate.opened.set()
        background_worker().drain()
