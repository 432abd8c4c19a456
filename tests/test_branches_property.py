"""Random sequences of invoke, fork (time travel to any finished checkpoint), edit (a message
replaced by id with update_state) and resume (a run replayed from the checkpoint where its input
had just arrived) leave, at every step, the branch being run with exactly the memory a fresh
thread fed that branch's history has: the same archived text, NOTES, search results and the
same view, RULES beside each question included. On InMemorySaver and SqliteSaver."""

from __future__ import annotations

import sqlite3
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver

from keeper_middleware import Keeper, KeeperConfig
from tests.branch_runs import (
    TASK,
    Memory,
    Put,
    Run,
    Step,
    feed,
    make_run,
    story,
    unnoted,
)

RULES = ("answer in French.", "say it twice.", "round every figure.")
CUTTING = KeeperConfig(window=2048, reply_reserve=256, notes_every_items=2)
"""Cuts every two items or so, so a few steps make several cuts on several branches."""


@dataclass
class Point:
    """A finished checkpoint, the history that led to it, and the checkpoint where its last
    input had just arrived (where a replay starts)."""

    config: dict[str, Any]
    steps: list[Step]
    arrived: dict[str, Any] | None = None
    inputs: int = field(default=0)


def view(run: Run, config: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple((m.type, str(m.content)) for m in run.state(config).values["messages"])


def memory_and_view(run: Run, config: dict[str, Any]) -> tuple[Memory, tuple[tuple[str, str], ...]]:
    return run.memory(config), view(run, config)


_REFERENCES: dict[str, tuple[Memory, tuple[tuple[str, str], ...]]] = {}


def reference(steps: list[Step]) -> tuple[Memory, tuple[tuple[str, str], ...]]:
    """What a fresh thread fed ``steps`` remembers and shows (worked out once per history)."""
    key = repr(
        [
            step if not isinstance(step, Put) else [(m.id, m.content) for m in step.messages]
            for step in steps
        ]
    )
    if key not in _REFERENCES:
        fresh = make_run("agent", InMemorySaver(), Keeper(CUTTING))
        fresh.thread = "control"
        feed(fresh, steps)
        _REFERENCES[key] = (fresh.memory(), view(fresh, fresh.config()))
    return _REFERENCES[key]


class Branching(RuleBasedStateMachine):
    saver_kind = "memory"

    @initialize()
    def start(self) -> None:
        self._folder = tempfile.TemporaryDirectory()
        if self.saver_kind == "sqlite":
            self._conn = sqlite3.connect(
                Path(self._folder.name) / "checkpoints.sqlite3", check_same_thread=False
            )
            saver: Any = SqliteSaver(self._conn)
        else:
            saver = InMemorySaver()
        self.run = make_run("agent", saver, Keeper(CUTTING))
        self.serial = 0
        self.points: list[Point] = []
        self.current = self._say(None, [], (TASK, "task"), 0)

    def teardown(self) -> None:
        if self.saver_kind == "sqlite":
            self._conn.close()
        self._folder.cleanup()

    def _say(
        self, point: Point | None, steps: list[Step], step: tuple[str, str], inputs: int
    ) -> Point:
        before = {
            s.config["configurable"]["checkpoint_id"]
            for s in self.run.graph.get_state_history(self.run.config())
        }
        feed(self.run, [step], None if point is None else point.config)
        made = [
            s
            for s in self.run.graph.get_state_history(self.run.config())
            if s.config["configurable"]["checkpoint_id"] not in before
        ]
        arrived = next((s.config for s in reversed(made) if s.next == ("keeper",)), None)
        done = Point(self.run.state().config, [*steps, step], arrived, inputs + 1)
        self.points.append(done)
        self._check(done)
        return done

    def _check(self, point: Point) -> None:
        """The branch remembers what a fresh thread fed its history does."""
        assert memory_and_view(self.run, point.config) == reference(point.steps)

    @rule(
        counter=st.integers(1, 4),
        value=st.integers(-20, 99),
        rule_text=st.sampled_from((None, None, *RULES)),
        question=st.booleans(),
    )
    def invoke(self, counter: int, value: int, rule_text: str | None, question: bool) -> None:
        self._invoke(counter, value, rule_text, question)

    @precondition(lambda self: len(self.points) > 1)
    @rule(
        data=st.data(),
        counter=st.integers(1, 4),
        value=st.integers(-20, 99),
        rule_text=st.sampled_from((None, *RULES)),
    )
    def travel_and_invoke(
        self, data: st.DataObject, counter: int, value: int, rule_text: str | None
    ) -> None:
        """Back to any finished checkpoint, and a new input from there (a fork)."""
        self.current = data.draw(st.sampled_from(self.points))
        self._invoke(counter, value, rule_text, False)

    def _invoke(self, counter: int, value: int, rule_text: str | None, question: bool) -> None:
        item = self.current.inputs
        self.serial += 1
        if question:
            text = f"Item {item}. Questions: 1. What value does c{counter} hold now?"
        else:
            text = story(item, f"Today we set c{counter} to {value}.")
            if rule_text:
                text += f"\nRule: {rule_text}"
        self.current = self._say(self.current, self.current.steps, (text, f"m{self.serial}"), item)

    @precondition(lambda self: len(self.points) > 1)
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        self.current = data.draw(st.sampled_from(self.points))

    @rule(data=st.data(), value=st.integers(100, 199))
    def edit(self, data: st.DataObject, value: int) -> None:
        candidates = [
            i for i in unnoted(self.run, self.current.config) if i.startswith("m") and i != "task"
        ]
        messages = {m.id: m for m in self.run.state(self.current.config).values["messages"]}
        candidates = [i for i in candidates if "Questions" not in str(messages[i].content)]
        if not candidates:
            return
        target = data.draw(st.sampled_from(candidates))
        item = int(str(messages[target].content).split(".")[0].split()[1])
        text = story(item, f"Today we set c1 to {value}.")
        change = Put((HumanMessage(text, id=target),))
        config = self.run.graph.update_state(
            self.current.config, {"messages": list(change.messages)}
        )
        point = Point(config, [*self.current.steps, change], None, self.current.inputs)
        self.points.append(point)
        self.current = point
        self._check(point)

    @precondition(lambda self: any(p.arrived for p in self.points))
    @rule(data=st.data())
    def resume(self, data: st.DataObject) -> None:
        point = data.draw(st.sampled_from([p for p in self.points if p.arrived]))
        self.run.graph.invoke(None, point.arrived)
        replayed = Point(self.run.state().config, list(point.steps), None, point.inputs)
        self.points.append(replayed)
        self.current = replayed
        self._check(replayed)


class BranchingOnSqlite(Branching):
    saver_kind = "sqlite"


SETTINGS = settings(
    max_examples=20,
    stateful_step_count=14,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestBranchingInMemory = pytest.mark.timeout(1200)(Branching.TestCase)
TestBranchingInMemory.settings = SETTINGS
TestBranchingOnSqlite = pytest.mark.timeout(1200)(BranchingOnSqlite.TestCase)
TestBranchingOnSqlite.settings = SETTINGS
