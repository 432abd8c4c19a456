"""What a LangGraph power user does to a keeper thread, each against a control: a fresh thread fed
the same branch's history must have the same memory (archived turns, NOTES, what search finds).

On SQLite (a file archive beside ``SqliteSaver``) and on PostgreSQL (archive and checkpoints in
one database; the postgres tier starts a server itself):

- a fork from a checkpoint before a cut, both branches driven past cuts of their own, in turn;
  then a resume from an old checkpoint of each, found in ``get_state_history``;
- ``durability="exit" | "async" | "sync"``;
- two threads at once, async, on one archive;
- an ``asyncio`` task cancelled during a note call: the archive holds no half of that cut, and
  the next invoke works.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from langchain_core.messages import BaseMessage, HumanMessage

from keeper_middleware import Keeper
from keeper_middleware.messages.facts import keeper_kind
from tests.branch_runs import (
    CONFIG,
    TASK,
    Put,
    Run,
    Step,
    answer_with_rules,
    checkpointer_of,
    control,
    feed,
    make_run,
    story,
)
from tests.fake_model import ScriptedChatModel
from tests.story_model import StoryModel

# the keeper cuts every three items: items 1-2 are common, the fork is before the cut at item 3
COMMON: list[Step] = [
    (TASK, "task"),
    *((story(i, f"Today we set c{i} to {i * 3}."), f"c-{i}") for i in (1, 2)),
]
LEFT: list[Step] = [(story(i, f"Today we set c{i} to {i * 3}."), f"l-{i}") for i in range(3, 10)]
RIGHT: list[Step] = [
    (story(3, "Today we set omega to 5.") + "\nRule: say it twice.", "r-3"),
    *((story(i, f"Today we set r{i} to {i * 7}."), f"r-{i}") for i in range(4, 10)),
]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request, tmp_path) -> Iterator[tuple[str, Any]]:
    """(checkpointer kind, archive) of one backend: a SQLite file, or a PostgreSQL schema."""
    if request.param == "sqlite":
        yield "sqlite", tmp_path / "archive.sqlite3"
        return
    url = request.getfixturevalue("postgres_url")
    yield "postgres", f"{url}?schema={request.getfixturevalue('pg_schema')}"


@contextmanager
def run_on(backend: tuple[str, Any], tmp_path, *, run_async: bool = False) -> Iterator[Run]:
    """An agent on the backend's archive and checkpoints (``run_async``: checkpoints in memory,
    the sync savers having no async methods; the archive is the backend's all the same)."""
    kind, archive = backend
    url = str(archive).split("?")[0] if kind == "postgres" else None
    with checkpointer_of("memory" if run_async else kind, tmp_path, url) as saver:
        keeper = Keeper(CONFIG, archive=archive)
        run = make_run("agent", saver, keeper)
        run.thread = f"t-{id(run)}"
        try:
            yield run
        finally:
            keeper.close()


def last_input(snapshot: Any) -> str | None:
    humans = [m for m in snapshot.values.get("messages", []) if isinstance(m, HumanMessage)]
    return str(humans[-1].id) if humans else None


def checkpoint_after(run: Run, msg_id: str) -> Any:
    """The finished checkpoint whose last input is ``msg_id``, from ``get_state_history``."""
    for snapshot in run.graph.get_state_history(run.config()):
        if not snapshot.next and last_input(snapshot) == msg_id:
            return snapshot
    raise AssertionError(f"no finished checkpoint after {msg_id}")


def test_a_fork_before_a_cut_runs_both_branches_past_cuts_and_resumes_old_checkpoints(
    backend, tmp_path
):
    with run_on(backend, tmp_path) as run:
        feed(run, COMMON)
        fork = checkpoint_after(run, "c-2").config
        left = right = fork
        for mine, theirs in zip(LEFT, RIGHT, strict=True):  # in turn, each past cuts
            run.say(mine[0], left, msg_id=mine[1])
            left = run.state().config
            run.say(theirs[0], right, msg_id=theirs[1])
            right = run.state().config
        assert run.keeper.counters(run.thread).cuts >= 4
        assert run.memory(left) == control(COMMON + LEFT)
        assert run.memory(right) == control(COMMON + RIGHT)
        # resume each branch from an old checkpoint of its own, found in the history
        extra = (story(10, "Today we set z to 1."), "z-10")
        for branch, ids in ((LEFT, "l-5"), (RIGHT, "r-5")):
            old = checkpoint_after(run, ids).config
            run.say(extra[0], old, msg_id=extra[1])
            upto = [s[1] for s in branch].index(ids) + 1
            assert run.memory(run.state().config) == control(COMMON + branch[:upto] + [extra])
        every = list(run.keeper.archive.turns(run.thread))
        assert len({(t.msg_id, t.digest) for t in every}) == len(every)


@pytest.mark.parametrize("durability", ["exit", "async", "sync"])
def test_every_durability_keeps_the_same_memory(backend, tmp_path, durability):
    with run_on(backend, tmp_path) as run:
        for text, msg_id in COMMON + LEFT[:5]:
            run.graph.invoke(
                {"messages": [HumanMessage(text, id=msg_id)]}, run.config(), durability=durability
            )
        assert run.memory() == control(COMMON + LEFT[:5])


def test_two_threads_at_once_async_on_one_archive(backend, tmp_path):
    with run_on(backend, tmp_path, run_async=True) as run:

        async def drive(thread: str, steps: list[Step]) -> None:
            for text, msg_id in steps:  # type: ignore[misc]
                config = {"configurable": {"thread_id": thread}}
                await run.graph.ainvoke({"messages": [HumanMessage(text, id=msg_id)]}, config)

        one, two = f"{run.thread}-1", f"{run.thread}-2"
        asyncio.run(_both(drive(one, COMMON + LEFT[:5]), drive(two, COMMON + RIGHT[:5])))
        run.thread = one
        assert run.memory() == control(COMMON + LEFT[:5])
        run.thread = two
        assert run.memory() == control(COMMON + RIGHT[:5])


async def _both(*runs: Any) -> None:
    await asyncio.gather(*runs)


def test_a_task_cancelled_during_a_note_call_leaves_no_half_cut_and_the_thread_goes_on(
    backend, tmp_path
):
    in_note, release = threading.Event(), threading.Event()
    story_model = StoryModel(answer=answer_with_rules)  # as the control's
    hold = {"on": True}

    def reply(messages: list[BaseMessage]) -> Any:
        if hold["on"] and keeper_kind(messages[-1]) == "notes_request":
            in_note.set()
            release.wait(10)  # the note call is under way when the task is cancelled
        return story_model(messages)

    with run_on(backend, tmp_path, run_async=True) as run:
        run.model = ScriptedChatModel(default=reply)
        run.graph = _with_model(run)
        feed(run, COMMON)
        cuts_before = run.keeper.counters(run.thread).cuts

        async def cancel_one() -> None:
            text, msg_id = LEFT[0]  # type: ignore[misc]
            task = asyncio.create_task(
                run.graph.ainvoke({"messages": [HumanMessage(text, id=msg_id)]}, run.config())
            )
            await asyncio.get_running_loop().run_in_executor(None, in_note.wait, 10)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            hold["on"] = False
            release.set()

        asyncio.run(cancel_one())
        assert in_note.is_set()
        assert run.keeper.counters(run.thread).cuts == cuts_before  # no cut half-made
        for text, msg_id in LEFT[1:4]:  # type: ignore[misc]
            asyncio.run(
                run.graph.ainvoke({"messages": [HumanMessage(text, id=msg_id)]}, run.config())
            )
        held = [str(m.id) for m in run.state().values["messages"] if isinstance(m, HumanMessage)]
        archived = [t.msg_id for t in run.keeper.turns(run.thread, head=run.head())]
        # the branch's history: the cancelled input, when its checkpoint kept it, unanswered
        text, msg_id = LEFT[0]  # type: ignore[misc]
        kept = msg_id in held or msg_id in archived
        cancelled: list[Step] = [Put((HumanMessage(text, id=msg_id),))] if kept else []
        assert run.memory() == control([*COMMON, *cancelled, *LEFT[1:4]])
        every = list(run.keeper.archive.turns(run.thread))
        assert len({(t.msg_id, t.digest) for t in every}) == len(every)


def _with_model(run: Run) -> Any:
    from keeper_middleware import create_keeper_agent

    return create_keeper_agent(run.model, keeper=run.keeper, checkpointer=run.graph.checkpointer)
