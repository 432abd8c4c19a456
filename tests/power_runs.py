"""Helpers of the power-user tier (``tests/test_power_user_tier.py``): where a scenario's
checkpoints and archive live (a SQLite file beside SqliteSaver's, or PostgreSQL beside
PostgresSaver), the control a branch is checked against (a fresh thread fed that branch's
history), a scripted model whose note call can be held, and the process a scenario kills."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.outputs import ChatResult
from pydantic import PrivateAttr

from keeper_middleware import Keeper
from keeper_middleware.messages.facts import keeper_kind
from tests.branch_runs import CONFIG, Memory, Run, checkpointer_of, control, make_run, story
from tests.fake_model import ScriptedChatModel
from tests.story_model import StoryModel

COMMON = (
    ("Task: read every item. Rule: keep every figure exact.", "task"),
    *((story(i, f"Today we set c{i} to {i * 3}."), f"item-{i}") for i in range(1, 6)),
)
"""Items 1-5 (the keeper cuts every three items: at items 3, 6, 9, 12)."""


def branch(side: str, rule: str, last: int = 12) -> tuple[tuple[str, str], ...]:
    """Items 6..``last`` of one branch: a rule and counters only that branch knows."""
    first = (story(6, f"Today we set {side} to 9.") + f"\nRule: {rule}", f"{side}-6")
    rest = tuple(
        (story(i, f"Today we set c{i} to {i * 7 + len(side)}."), f"{side}-{i}")
        for i in range(7, last + 1)
    )
    return (first, *rest)


LEFT = branch("zeta", "answer in French.")
RIGHT = branch("omega", "say it twice.")
QUESTION = ("Item 13. Questions: 1. What value does c1 hold now?", "question")


@functools.cache
def control_memory(steps: tuple[tuple[str, str], ...]) -> Memory:
    """The memory of a fresh thread fed ``steps`` (cached: many scenarios share a history)."""
    return control(list(steps))


@dataclass
class Backend:
    """Where one scenario's checkpoints and archive live."""

    kind: str
    tmp: Path
    url: str | None = None
    schema: str | None = None

    def archive(self) -> str | Path:
        if self.kind == "sqlite":
            return self.tmp / "archive.sqlite3"
        return f"{self.url}?schema={self.schema}"

    def keeper(self) -> Keeper:
        """A keeper on the scenario's archive (a new one each call: a process restarted)."""
        return Keeper(CONFIG, archive=self.archive())

    def thread(self, name: str) -> str:
        """A thread id of its own (PostgresSaver's tables are shared by the whole session)."""
        return f"{name}-{self.schema}" if self.schema else name

    @contextmanager
    def saver(self) -> Iterator[Any]:
        with checkpointer_of(self.kind, self.tmp, self.url) as saver:
            yield saver

    @asynccontextmanager
    async def asaver(self) -> AsyncIterator[Any]:
        """The async checkpointer of the same store (SqliteSaver has no async methods)."""
        if self.kind == "sqlite":
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

            async with AsyncSqliteSaver.from_conn_string(
                str(self.tmp / "checkpoints.sqlite3")
            ) as saver:
                yield saver
            return
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

        assert self.url is not None
        async with AsyncPostgresSaver.from_conn_string(self.url) as pg_saver:
            await pg_saver.setup()
            yield pg_saver

    def run(self, saver: Any, name: str, keeper: Keeper | None = None) -> Run:
        run = make_run("agent", saver, keeper or self.keeper())
        run.thread = self.thread(name)
        return run


def one_node_graph(state: type[Any], name: str, node: Any, saver: Any) -> Any:
    """A parent graph of one node (``START -> name -> END``) with the scenario's checkpointer."""
    from langgraph.graph import END, START, StateGraph

    parent = StateGraph(state)
    parent.add_node(name, node)
    parent.add_edge(START, name)
    parent.add_edge(name, END)
    return parent.compile(checkpointer=saver)


def tip(run: Run) -> dict[str, Any]:
    """The config of the checkpoint the last run wrote (the tip of the branch it ran on)."""
    return dict(run.state().config)


def completed_after(run: Run, item_id: str) -> Any:
    """The finished checkpoint whose last input is ``item_id`` (on any branch)."""
    for snapshot in run.completed():
        humans = [m for m in snapshot.values["messages"] if isinstance(m, HumanMessage)]
        if humans and humans[-1].id == item_id:
            return snapshot
    raise AssertionError(f"no finished checkpoint after {item_id}")


def fork_tip(run: Run, ids: set[str], fork_at: str) -> Any:
    """The newest checkpoint holding one of the inputs ``ids`` (a fork's), else the checkpoint
    the fork started from (the one after input ``fork_at``)."""
    for snapshot in run.graph.get_state_history(run.config()):
        humans = {m.id for m in snapshot.values.get("messages", []) if isinstance(m, HumanMessage)}
        if humans & ids:
            return snapshot
    return completed_after(run, fork_at)


def waiting_for_keeper(run: Run, item_id: str) -> Any:
    """The checkpoint where input ``item_id`` had arrived and the keeper had not yet run."""
    for snapshot in run.graph.get_state_history(run.config()):
        humans = [m for m in snapshot.values.get("messages", []) if isinstance(m, HumanMessage)]
        if snapshot.next == ("keeper",) and humans and humans[-1].id == item_id:
            return snapshot
    raise AssertionError(f"no checkpoint waiting for the keeper after {item_id}")


def assert_whole(keeper: Keeper, thread: str, head: str | None) -> None:
    """No archived turn of a branch is there twice (a message, by id and text)."""
    turns = [(t.msg_id, t.content) for t in keeper.turns(thread, head=head)]
    assert turns, "nothing archived"
    assert len(set(turns)) == len(turns), [t for t in turns if turns.count(t) > 1]


class HeldNotesModel(ScriptedChatModel):
    """The story model whose note calls (async) wait once :meth:`hold` is called, until its
    release is set: a scenario can cancel a run in the middle of a note call. The gate is
    shared with the copies ``bind_tools`` makes."""

    _gate: dict[str, asyncio.Event] = PrivateAttr(default_factory=dict)

    def hold(self) -> tuple[asyncio.Event, asyncio.Event]:
        """Holds the next note calls; returns (entered, release)."""
        self._gate.update(entered=asyncio.Event(), release=asyncio.Event())
        return self._gate["entered"], self._gate["release"]

    async def _agenerate(
        self, messages: list[BaseMessage], stop: list[str] | None = None, **kwargs: Any
    ) -> ChatResult:
        if messages and keeper_kind(messages[-1]) == "notes_request" and self._gate:
            self._gate["entered"].set()
            await self._gate["release"].wait()
        return self._generate(messages, stop, **kwargs)


def held_run(backend: Backend, saver: Any, name: str) -> tuple[Run, HeldNotesModel]:
    from keeper_middleware import create_keeper_agent
    from tests.branch_runs import answer_with_rules

    model = HeldNotesModel(default=StoryModel(answer=answer_with_rules))
    keeper = backend.keeper()
    graph = create_keeper_agent(model, keeper=keeper, checkpointer=saver)
    return Run(keeper=keeper, graph=graph, model=model, thread=backend.thread(name)), model


# ---------------------------------------------------------------- the process killed at a cut


def killed_child(kind: str, tmp: str, url: str, schema: str, moment: str) -> None:
    """Run in a child process: items 1-5, the left branch's items 6-7 (a cut), then a fork from
    item 5 fed the right branch until its first cut; the process is killed (SIGKILL) the moment
    that cut is committed, before LangGraph saves the checkpoint after it (``moment="commit"``),
    or while its note call is in flight (``"note call"``), or so while the checkpoint where
    the input arrived is still being written in the background (``"unsaved input"``: LangGraph's
    default durability, "async", writes it beside the next step)."""
    from tests.branch_runs import feed

    backend = Backend(kind, Path(tmp), url or None, schema or None)
    with backend.saver() as saver:
        run = backend.run(saver, "killed")
        feed(run, list(COMMON))
        fork = tip(run)
        feed(run, list(LEFT[:2]))
        archive = run.keeper.archive
        commit = archive.commit_cut

        def commit_then_die(*args: Any, **kwargs: Any) -> Any:
            result = commit(*args, **kwargs)
            os.kill(os.getpid(), signal.SIGKILL)
            return result

        def die_in_note_call(messages: list[BaseMessage]) -> None:
            if keeper_kind(messages[-1]) == "notes_request":
                os.kill(os.getpid(), signal.SIGKILL)

        if moment == "commit":
            archive.commit_cut = commit_then_die  # type: ignore[method-assign]
        else:
            run.model.default.hook = die_in_note_call
        feed(run, list(RIGHT[:1]), fork)  # no cut yet
        if moment == "unsaved input":
            put = saver.put

            def slow_put(*args: Any, **kwargs: Any) -> Any:
                time.sleep(5)  # the note call's kill comes first
                return put(*args, **kwargs)

            saver.put = slow_put
        feed(run, list(RIGHT[1:]), tip(run))
    raise SystemExit("the fork's first cut was never committed")


if __name__ == "__main__":
    killed_child(*sys.argv[1:6])
