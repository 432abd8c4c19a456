"""A crash at any step of a cut loses nothing and duplicates nothing.

Each test raises at one step of a cut, then retries the run from the checkpoint (as LangGraph does
with ``invoke(None)``) on a keeper reopened from the same files: every turn is archived exactly
once and the NOTES match the archive.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from keeper_middleware import Keeper, KeeperConfig, SQLiteArchive, create_keeper_agent
from tests.fake_model import ScriptedChatModel
from tests.story_model import StoryModel, batch

CONFIG = KeeperConfig(window=4096, reply_reserve=256, notes_every_items=3)
THREAD = {"configurable": {"thread_id": "t1"}}


class BoomError(RuntimeError):
    pass


def crashing_once(fn, when=lambda *a, **k: True):
    state = {"armed": True}

    def wrapper(*args, **kwargs):
        if state["armed"] and when(*args, **kwargs):
            state["armed"] = False
            raise BoomError("injected crash")
        return fn(*args, **kwargs)

    return wrapper


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def archive_at(request, tmp_path):
    """Opens the same archive again each call, as a restarted process would."""
    if request.param == "sqlite":
        return lambda: tmp_path / "archive.sqlite3"
    from keeper_middleware.archive.postgres import PostgresArchive

    url, schema = request.getfixturevalue("postgres_url"), request.getfixturevalue("pg_schema")
    return lambda: PostgresArchive(url, schema=schema)


def run_until_crash_and_recover(archive_at, inject) -> Keeper:
    saver = InMemorySaver()
    keeper = Keeper(CONFIG, archive=archive_at())
    model = ScriptedChatModel(default=StoryModel())
    agent = create_keeper_agent(model, keeper=keeper, checkpointer=saver)
    agent.invoke({"messages": [HumanMessage("Task: read. Rule: keep it exact.")]}, THREAD)
    for i in range(1, 3):
        agent.invoke(
            {"messages": [HumanMessage(batch(i, f"Today we set c{i} to {i * 3}."))]}, THREAD
        )
    inject(keeper, model)
    with pytest.raises(BoomError):
        agent.invoke({"messages": [HumanMessage(batch(3, "Today we set c3 to 9."))]}, THREAD)
    keeper.close()
    # the process "restarts": a new keeper on the same files; the run resumes from the checkpoint
    reopened = Keeper(CONFIG, archive=archive_at())
    agent = create_keeper_agent(
        ScriptedChatModel(default=StoryModel()), keeper=reopened, checkpointer=saver
    )
    agent.invoke(None, THREAD)
    for i in range(4, 10):
        agent.invoke(
            {"messages": [HumanMessage(batch(i, f"Today we set c{i} to {i * 3}."))]}, THREAD
        )
    return reopened


def assert_consistent(keeper: Keeper) -> None:
    turns = list(keeper.archive.turns("t1"))
    ids = [t.msg_id for t in turns]
    assert len(ids) == len(set(ids)), "a turn was archived twice"
    assert [t.seq for t in turns] == list(range(len(turns)))
    batches = [t.content for t in turns if t.content.startswith("Item ")]
    assert len(batches) == len(set(batches)), "an input was archived twice"
    assert {int(b.split(".")[0].split()[1]) for b in batches} == set(range(1, len(batches) + 1))
    versions = list(keeper.archive.notes_versions("t1"))
    # one NOTES version per cut, none lost and none written twice by the recovery
    assert len(versions) == keeper.archive.get_value("t1", "counters")["cuts"] >= 2
    assert [v.version for v in versions] == list(range(1, len(versions) + 1))
    ends = [v.last_item for v in versions]
    assert ends == sorted(set(ends)), "two versions cover the same items"
    notes = keeper.notes("t1")
    assert ends[-1] == notes.last_item
    assert notes.rules == ("keep it exact.",)
    assert notes.state_dict() == {f"c{i}": str(i * 3) for i in range(1, notes.last_item + 1)}
    hits = keeper.retriever.search("c1", session="t1")
    assert len({h.passage.position for h in hits}) == len(hits)


def test_crash_during_the_note_call(archive_at):
    def inject(keeper, model):
        model.default.hook = crashing_once(
            lambda messages: None, lambda messages: "[NOTES REQUEST]" in str(messages[-1].content)
        )

    assert_consistent(run_until_crash_and_recover(archive_at, inject))


def test_crash_during_the_reask(archive_at):
    def inject(keeper, model):
        model.default.invent_working_first = True
        model.default.hook = crashing_once(
            lambda messages: None, lambda messages: "[NOTES CHECK]" in str(messages[-1].content)
        )

    assert_consistent(run_until_crash_and_recover(archive_at, inject))


def test_crash_inside_the_archive_transaction(archive_at):
    def inject(keeper, model):
        keeper.archive._before_commit = crashing_once(keeper.archive._before_commit)

    keeper = run_until_crash_and_recover(archive_at, inject)
    assert_consistent(keeper)


def test_crash_after_the_archive_commit_before_the_state_is_saved(archive_at):
    def inject(keeper, model):
        keeper._sync_index = crashing_once(keeper._sync_index)

    keeper = run_until_crash_and_recover(archive_at, inject)
    assert_consistent(keeper)
    versions = list(keeper.archive.notes_versions("t1"))
    assert len({v.cut_key for v in versions}) == len(versions), "a cut was committed twice"


def test_crash_after_the_cut_and_its_counters_are_saved_counts_the_cut_once(archive_at):
    # the step is redone from the checkpoint and commits the same cut again, which the archive
    # answers with the first record: the cut counter must not count it a second time
    def inject(keeper, model):
        save = keeper.sessions.save_counters

        def saved_then_crash(session):
            save(session)
            if keeper.sessions.counters(session).cuts >= 1 and not state["crashed"]:
                state["crashed"] = True
                raise BoomError("injected crash")

        state = {"crashed": False}
        keeper.sessions.save_counters = saved_then_crash

    keeper = run_until_crash_and_recover(archive_at, inject)
    assert_consistent(keeper)


def test_indexing_that_fails_in_the_background_fails_no_step_and_is_caught_up_later(
    archive_at, caplog
):
    keeper = Keeper(CONFIG, archive=archive_at())
    keeper.retriever.add = crashing_once(keeper.retriever.add)
    agent = create_keeper_agent(
        ScriptedChatModel(default=StoryModel()), keeper=keeper, checkpointer=InMemorySaver()
    )
    agent.invoke({"messages": [HumanMessage("Task: read. Rule: keep it exact.")]}, THREAD)
    for i in range(1, 10):  # the cuts' indexing runs (and once fails) off the steps' path
        agent.invoke(
            {"messages": [HumanMessage(batch(i, f"Today we set c{i} to {i * 3}."))]}, THREAD
        )
    keeper.indexing.drain()
    assert "injected crash" in caplog.text
    assert "item 1:" in keeper.search("t1", "c1")
    assert_consistent(keeper)
    keeper.close()


def test_reopened_archive_continues_the_same_session(archive_at):
    keeper = Keeper(CONFIG, archive=archive_at())
    agent = create_keeper_agent(
        ScriptedChatModel(default=StoryModel()), keeper=keeper, checkpointer=InMemorySaver()
    )
    agent.invoke({"messages": [HumanMessage("Task: read. Rule: keep it exact.")]}, THREAD)
    for i in range(1, 7):
        agent.invoke(
            {"messages": [HumanMessage(batch(i, f"Today we set c{i} to {i * 3}."))]}, THREAD
        )
    before = keeper.archive.turn_count("t1")
    notes = keeper.notes("t1")
    keeper.close()
    location = archive_at()
    with location if not isinstance(location, Path) else SQLiteArchive(location) as archive:
        assert archive.turn_count("t1") == before
    reopened = Keeper(CONFIG, archive=archive_at())
    assert reopened.notes("t1") == notes
    assert reopened.counters("t1").cuts == 2
    assert reopened.search("t1", "c2").startswith("Found")
