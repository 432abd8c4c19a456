"""The phase-span hook: a listener hears each phase of a step (and of a search) start and end, nested
as the work is, whether the keeper was given it or it listens to every keeper of the process."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from langchain_core.messages import BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from keeper_middleware import Keeper, KeeperConfig, create_keeper_agent
from keeper_middleware.errors import ArgumentTypeError, KeeperError
from keeper_middleware.messages.facts import keeper_kind
from keeper_middleware.phases import PHASES, PhaseListener, listened, listening
from keeper_middleware.testing import ScriptedChatModel

THREAD = {"configurable": {"thread_id": "traced"}}


class Recorder:
    """A user's tracing listener: every span start and end, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []
        self.errors: list[BaseException | None] = []

    def phase_started(self, phase: str, session: str) -> None:
        self.events.append(("start", phase, session))

    def phase_ended(self, phase: str, session: str, error: BaseException | None) -> None:
        self.events.append(("end", phase, session))
        self.errors.append(error)

    def steps(self) -> list[list[tuple[str, str]]]:
        """The spans of each step, as (start|end, phase)."""
        steps: list[list[tuple[str, str]]] = []
        for what, phase, _session in self.events:
            if (what, phase) == ("start", "step"):
                steps.append([])
            if steps:
                steps[-1].append((what, phase))
        return steps


def _reply(messages: list[BaseMessage]) -> str:
    if keeper_kind(messages[-1]) in ("notes_request", "notes_reask"):
        return "NO CHANGES"
    return "Read."


def _items(count: int) -> list[str]:
    return [
        f"Item {n}.\nMira Holt recorded domo{n:02d} at {n * 3}. " + "The ferry ran late. " * 40
        for n in range(1, count + 1)
    ]


def _keeper(**kwargs: Any) -> Keeper:
    return Keeper(KeeperConfig(window=2048, notes_every_items=4), **kwargs)


def _run(keeper: Keeper, items: int = 20) -> None:
    agent = create_keeper_agent(
        ScriptedChatModel(default=_reply), keeper=keeper, checkpointer=InMemorySaver()
    )
    for text in _items(items):
        agent.invoke({"messages": [HumanMessage(text)]}, THREAD)


CUT_STEP = [
    ("start", "step"),
    ("start", "prepare"),
    ("end", "prepare"),
    ("start", "note_request"),
    ("start", "note_call"),
    ("end", "note_call"),
    ("end", "note_request"),
    ("start", "commit"),
    ("start", "index_sync"),
    ("end", "index_sync"),
    ("end", "commit"),
    ("end", "step"),
]


def test_a_keepers_listener_hears_the_spans_of_a_step_with_a_cut_nested_as_the_work_is():
    recorder = Recorder()
    keeper = _keeper(phase_listener=recorder)
    _run(keeper)
    assert keeper.counters("traced").cuts >= 1
    steps = recorder.steps()
    assert CUT_STEP in steps
    # a step without a cut only prepares
    assert [("start", "step"), ("start", "prepare"), ("end", "prepare"), ("end", "step")] in steps
    assert {session for _, _, session in recorder.events} == {"traced"}
    assert set(phase for _, phase, _ in recorder.events) <= set(PHASES)
    assert recorder.errors == [None] * len(recorder.errors)
    keeper.close()


def test_a_search_is_one_span():
    recorder = Recorder()
    keeper = _keeper(phase_listener=recorder)
    keeper.run_search_tool("traced", {"query": "ferry"})
    assert recorder.events == [("start", "search", "traced"), ("end", "search", "traced")]
    keeper.close()


def test_the_async_step_reports_the_same_spans():
    recorder = Recorder()
    keeper = _keeper(phase_listener=recorder)
    agent = create_keeper_agent(
        ScriptedChatModel(default=_reply), keeper=keeper, checkpointer=InMemorySaver()
    )

    async def run() -> None:
        for text in _items(20):
            await agent.ainvoke({"messages": [HumanMessage(text)]}, THREAD)

    asyncio.run(run())
    assert CUT_STEP in recorder.steps()
    keeper.close()


def test_listening_hears_every_keeper_of_the_process_only_while_the_block_runs():
    recorder = Recorder()
    keeper = _keeper()  # made before: it is heard too
    with listening(recorder) as listener:
        assert listener is recorder and listened()
        _run(keeper)
    heard = len(recorder.events)
    assert CUT_STEP in recorder.steps()
    assert not listened()
    _run(keeper, items=2)
    assert len(recorder.events) == heard
    keeper.close()


def test_a_span_that_raises_ends_with_the_error():
    recorder = Recorder()
    keeper = _keeper(phase_listener=recorder)

    def broken(messages: list[BaseMessage]) -> str:
        if keeper_kind(messages[-1]) in ("notes_request", "notes_reask"):
            raise ConnectionError("the model is down")
        return "Read."

    agent = create_keeper_agent(
        ScriptedChatModel(default=broken), keeper=keeper, checkpointer=InMemorySaver()
    )
    with pytest.raises(ConnectionError):
        for text in _items(20):
            agent.invoke({"messages": [HumanMessage(text)]}, THREAD)
    ended = [
        (phase, type(error).__name__)
        for (what, phase, _), error in zip(
            [e for e in recorder.events if e[0] == "end"], recorder.errors, strict=True
        )
        if error is not None and what == "end"
    ]
    assert ("note_call", "ConnectionError") in ended
    assert ("step", "ConnectionError") in ended
    assert recorder.events[-1] == ("end", "step", "traced")
    keeper.close()


def test_a_listener_that_fails_is_logged_and_never_breaks_the_step(caplog):
    class Failing:
        def phase_started(self, phase: str, session: str) -> None:
            raise ValueError("tracing backend unreachable")

        def phase_ended(self, phase: str, session: str, error: BaseException | None) -> None:
            raise ValueError("tracing backend unreachable")

    keeper = _keeper(phase_listener=Failing())
    with caplog.at_level(logging.ERROR, logger="keeper_middleware.phases"):
        _run(keeper)
    assert keeper.counters("traced").cuts >= 1
    assert "phase listener" in caplog.text
    keeper.close()


def test_a_listener_without_the_two_methods_is_refused_with_what_to_give():
    assert isinstance(Recorder(), PhaseListener)
    with pytest.raises(ArgumentTypeError, match="phase_started") as raised:
        _keeper(phase_listener=print)  # type: ignore[arg-type]
    assert isinstance(raised.value, KeeperError) and isinstance(raised.value, TypeError)
    with pytest.raises(ArgumentTypeError, match="phase_listener"), listening(object()):  # type: ignore[arg-type]
        pass
