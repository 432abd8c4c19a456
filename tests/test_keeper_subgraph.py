"""A keeper agent as a node of a parent graph that shares ``messages`` (a supervisor over it).

The agent's own state channel stays behind between calls of the node, and the parent's messages
keep everything the agent ever returned: its NOTES and RULES (marked), and the turns the archive
has since taken. The keeper must recognise its own messages when they come back, never stack
them and never take them, or the archived turns, for new input: each request carries one NOTES
block, and the note calls are those of the same agent on a thread of its own."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

import pytest
from langchain_core.messages import BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.types import Command

from keeper_middleware import Keeper, KeeperConfig, create_keeper_agent
from keeper_middleware.messages.facts import keeper_kind
from tests.fake_model import ScriptedChatModel
from tests.story_model import StoryModel, batch

CONFIG = KeeperConfig(window=2048)
INPUTS = 50
TASK = "Task: read every item. Rule: keep every figure exact."


def inputs() -> list[str]:
    texts = [TASK]
    for item in range(1, INPUTS):
        text = batch(item, f"Today we set c{item} to {item * 3}.", filler=30)
        texts.append(text + ("\nQuestions: 1. What is c1?" if item % 7 == 0 else ""))
    return texts


def notes_blocks(request: list[BaseMessage]) -> int:
    return sum(1 for m in request if keeper_kind(m) == "notes")


def on_its_own(config: KeeperConfig) -> tuple[Keeper, ScriptedChatModel]:
    keeper, model = Keeper(config), ScriptedChatModel(default=StoryModel())
    agent = create_keeper_agent(model, keeper=keeper, checkpointer=InMemorySaver())
    for text in inputs():
        agent.invoke({"messages": [HumanMessage(text)]}, {"configurable": {"thread_id": "t"}})
    return keeper, model


def under_a_supervisor(config: KeeperConfig) -> tuple[Keeper, ScriptedChatModel, Any]:
    keeper, model = Keeper(config), ScriptedChatModel(default=StoryModel())
    worker = create_keeper_agent(model, keeper=keeper)  # the parent's checkpointer serves it

    def supervisor(state: MessagesState) -> Command[Literal["worker"]]:
        return Command(goto="worker")  # one worker here; a real one picks among several

    parent = StateGraph(MessagesState)
    parent.add_node("supervisor", supervisor)
    parent.add_node("worker", worker)
    parent.add_edge(START, "supervisor")
    graph = parent.compile(checkpointer=InMemorySaver())
    for text in inputs():
        graph.invoke({"messages": [HumanMessage(text)]}, {"configurable": {"thread_id": "t"}})
    return keeper, model, graph


@pytest.mark.parametrize("state_messages", [None, "window_with_keeper"])
def test_a_keeper_agent_under_a_supervisor_keeps_one_notes_block_and_notes_each_turn_once(
    state_messages,
):
    config = replace(CONFIG, state_messages=state_messages)
    alone, _ = on_its_own(config)
    keeper, model, graph = under_a_supervisor(config)
    requests = [r.messages for r in model.received]
    assert max(notes_blocks(r) for r in requests) == 1
    assert alone.counters("t").notes_calls >= 5
    assert keeper.counters("t").notes_calls <= alone.counters("t").notes_calls + 1
    assert keeper.counters("t").cuts <= alone.counters("t").cuts + 1
    # every input archived once, none twice
    archived = [t.msg_id for t in keeper.archive.turns("t")]
    assert len(archived) == len(set(archived))
    humans = [m for m in graph.get_state({"configurable": {"thread_id": "t"}}).values["messages"]]
    assert len([m for m in humans if isinstance(m, HumanMessage) and not keeper_kind(m)]) == INPUTS
