"""Set-ups that used to lose something without a word now say what to do: a file archive under
a graph with no checkpointer, a thread started afresh over its archived turns, a synchronous
``invoke`` inside a running event loop, and a search of a thread that does not exist."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import sys
import types

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver

from keeper_middleware import KeeperConfig, KeeperError, UnknownSessionError, create_keeper_agent
from keeper_middleware.sessions import starts
from keeper_middleware.testing import ScriptedChatModel

LOGGER = "keeper_middleware"
THREAD = {"configurable": {"thread_id": "t"}}
SMALL = KeeperConfig(window=2048, notes_every_items=3)


def story(n: int) -> HumanMessage:
    return HumanMessage(f"Item {n}.\nMira Holt recorded domo{n:02d} at {n * 3}. " + "word " * 60)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def run_program(archive, checkpointer=None, items: int = 12) -> None:
    """One run of a program that feeds a thread its items one invoke at a time."""
    agent = create_keeper_agent(
        ScriptedChatModel(default="NO CHANGES"),
        config=SMALL,
        archive=archive,
        checkpointer=checkpointer,
    )
    for n in range(1, items + 1):
        agent.invoke({"messages": [story(n)]}, THREAD)
    agent.keeper.close()


def test_a_file_archive_without_a_checkpointer_says_each_invoke_starts_afresh(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    for _run in range(2):
        run_program(tmp_path / "archive.sqlite3")
    said = [m for m in warnings_of(caplog) if "no checkpointer" in m]
    assert len(said) == 2  # once per run (per keeper and thread), not once per invoke
    assert "archive.sqlite3" in said[0] and "checkpointer=SqliteSaver" in said[0]


def test_an_in_memory_archive_without_a_checkpointer_is_no_cause_for_a_warning(caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    run_program(":memory:", items=3)
    assert warnings_of(caplog) == []


def test_a_persistent_checkpointer_continues_the_thread_without_a_warning(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    for _run in range(2):
        with sqlite3.connect(tmp_path / "checkpoints.sqlite3", check_same_thread=False) as conn:
            run_program(tmp_path / "archive.sqlite3", SqliteSaver(conn))
    assert warnings_of(caplog) == []


def test_a_second_run_with_an_in_memory_checkpointer_says_the_archive_holds_unseen_turns(
    tmp_path, caplog
):
    run_program(tmp_path / "archive.sqlite3", InMemorySaver(), items=30)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    run_program(tmp_path / "archive.sqlite3", InMemorySaver(), items=1)
    run_program(tmp_path / "archive.sqlite3", items=3)  # no checkpointer: every invoke afresh
    said, unchecked, again = warnings_of(caplog)  # once a keeper and thread, not an invoke
    assert "no checkpointer" in unchecked and "already holds" in again
    assert "starts afresh but its archive already holds" in said
    assert "persistent checkpointer (SqliteSaver)" in said


@pytest.fixture
def loop_unsaid(monkeypatch):
    """The event-loop warning is logged once a process: as if not yet in this one."""
    monkeypatch.setattr(starts, "_loop_said", False)


def sync_invokes_in_a_loop(agents: int = 2, invokes: int = 3) -> None:
    async def handler() -> None:
        for _ in range(agents):
            agent = create_keeper_agent(
                ScriptedChatModel(default="Read."), checkpointer=InMemorySaver()
            )
            for n in range(invokes):
                agent.invoke({"messages": [story(n)]}, THREAD)

    asyncio.run(handler())


def test_a_sync_invoke_inside_a_running_event_loop_says_to_use_ainvoke(caplog, loop_unsaid):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    sync_invokes_in_a_loop()
    (said,) = warnings_of(caplog)  # once, not at every step nor for every keeper
    assert "inside a running event loop" in said and "ainvoke" in said


def test_a_notebook_cell_inside_the_kernels_loop_is_no_cause_for_a_warning(
    caplog, loop_unsaid, monkeypatch
):
    kernel = types.ModuleType("IPython")
    kernel.get_ipython = lambda: object()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", kernel)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    sync_invokes_in_a_loop(agents=1)
    assert warnings_of(caplog) == []


def test_ainvoke_in_the_event_loop_and_a_sync_invoke_outside_it_say_nothing(caplog, loop_unsaid):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    agent = create_keeper_agent(ScriptedChatModel(default="Read."), checkpointer=InMemorySaver())
    agent.invoke({"messages": [story(1)]}, THREAD)
    asyncio.run(agent.ainvoke({"messages": [story(2)]}, THREAD))
    assert warnings_of(caplog) == []


def test_retrieve_on_a_thread_that_does_not_exist_is_a_clear_error(tmp_path):
    run_program(tmp_path / "archive.sqlite3", InMemorySaver(), items=30)
    agent = create_keeper_agent(
        ScriptedChatModel(default="NO CHANGES"), config=SMALL, archive=tmp_path / "archive.sqlite3"
    )
    assert agent.keeper.retrieve("t", "domo02")  # the thread that ran, from its archive
    with pytest.raises(UnknownSessionError, match=r"thread 'T' is unknown.*Check the thread id"):
        agent.keeper.retrieve("T", "domo02")
    with pytest.raises(KeeperError) as raised:
        agent.keeper.retrieve("never", "domo02")
    assert isinstance(raised.value, LookupError)  # what a caller catching a missing key catches


def test_retrieve_on_a_thread_that_ran_but_archived_nothing_yet_is_an_empty_list():
    agent = create_keeper_agent(ScriptedChatModel(default="Read."), checkpointer=InMemorySaver())
    agent.invoke({"messages": [story(1)]}, THREAD)
    assert agent.keeper.retrieve("t", "domo01") == []
