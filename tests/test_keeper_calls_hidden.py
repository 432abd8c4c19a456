"""The keeper's own model calls (notes, re-asks) never reach what the user watches: the
``stream_mode="messages"`` stream, ``astream_events``, or a callback handler of theirs. A tracer
still sees them, under the run name ``keeper_notes``. Checked for every agent style."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any
from uuid import UUID

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.tracers.run_collector import RunCollectorCallbackHandler

from keeper_middleware import Keeper, create_keeper_agent
from keeper_middleware.messages.facts import keeper_kind, text_of
from tests.test_integrations_parity import (
    CONFIG,
    SYSTEM,
    THREAD,
    TOOLS,
    graph_agent,
    middleware_agent,
    react_agent,
    scenario,
    scripted_model,
)

pytestmark = pytest.mark.filterwarnings("ignore:create_react_agent has been moved")

TURNS = 24
NOTE_MARKS = ("RULE:", "SET ", "NO CHANGES")
NOTE_REQUESTS = ("notes_request", "notes_reask")


def keeper_agent(model: Any, keeper: Keeper) -> Any:
    from langgraph.checkpoint.memory import InMemorySaver

    return create_keeper_agent(
        model, TOOLS, system_prompt=SYSTEM, keeper=keeper, checkpointer=InMemorySaver()
    )


STYLES: dict[str, Callable[[Any, Keeper], Any]] = {
    "create_keeper_agent": keeper_agent,
    "KeeperNode": graph_agent,
    "KeeperMiddleware": middleware_agent,
    "pre_model_hook": react_agent,
}


class UserHandler(BaseCallbackHandler):
    """What an application's own handler sees: the requests of every chat-model call."""

    def __init__(self) -> None:
        self.requests: list[list[BaseMessage]] = []

    def on_chat_model_start(
        self, serialized: Any, messages: list[list[BaseMessage]], *, run_id: UUID, **kw: Any
    ) -> None:
        self.requests.extend(messages)


def is_note_text(text: str) -> bool:
    return any(mark in text for mark in NOTE_MARKS)


def config(*callbacks: Any) -> dict[str, Any]:
    return {"configurable": {"thread_id": THREAD}, "callbacks": list(callbacks)}


@pytest.mark.parametrize("style", STYLES)
def test_note_calls_never_reach_the_messages_stream(style):
    keeper, model = Keeper(CONFIG), scripted_model()
    agent = STYLES[style](model, keeper)
    streamed: list[str] = []
    for text in scenario(TURNS):
        for chunk, _meta in agent.stream(
            {"messages": [HumanMessage(text)]}, config(), stream_mode="messages"
        ):
            if chunk.type in ("ai", "AIMessageChunk"):
                streamed.append(text_of(chunk))
    assert keeper.counters(THREAD).notes_calls >= 2  # the run did take notes
    assert any(t in ("Noted.", "Understood.") for t in streamed)  # the agent's replies stream
    assert not [t for t in streamed if is_note_text(t)]


@pytest.mark.parametrize("style", STYLES)
def test_note_calls_never_reach_astream_events_or_a_user_handler_but_are_traced(style):
    keeper, model = Keeper(CONFIG), scripted_model()
    agent = STYLES[style](model, keeper)
    handler, tracer = UserHandler(), RunCollectorCallbackHandler()

    async def drive() -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for text in scenario(TURNS):
            async for event in agent.astream_events(
                {"messages": [HumanMessage(text)]}, config(handler, tracer), version="v2"
            ):
                events.append(event)
        return events

    events = asyncio.run(drive())
    notes_calls = keeper.counters(THREAD).notes_calls
    assert notes_calls >= 2
    model_events = [e for e in events if e["event"].startswith("on_chat_model")]
    assert model_events
    assert not [e for e in events if e.get("name") == "keeper_notes"]
    assert not [
        e
        for e in model_events
        if e["event"] == "on_chat_model_end" and is_note_text(text_of(e["data"]["output"]))
    ]
    assert handler.requests  # the user's handler sees the agent's own calls ...
    asked_for_notes = [r for r in handler.requests if keeper_kind(r[-1]) in NOTE_REQUESTS]
    assert not asked_for_notes  # ... and only those
    traced = [run for run in _all_runs(tracer.traced_runs) if run.name == "keeper_notes"]
    assert len(traced) == notes_calls
    assert all({"nostream", "keeper"} <= set(run.tags or []) for run in traced)
    assert all(run.parent_run_id is not None for run in traced)  # under the keeper's own step


def _all_runs(runs: list[Any]) -> list[Any]:
    found: list[Any] = []
    for run in runs:
        found.append(run)
        found.extend(_all_runs(run.child_runs))
    return found
