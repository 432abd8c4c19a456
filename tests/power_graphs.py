"""Graphs of the power-user tier (``tests/test_power_user_tier.py``): the parent states that
hold keeper agents as subgraphs or stateless subagents, a tool that waits for a person, and the
keeper followed by a ``Send`` fan-out of model calls (with its control, the same calls made one
after another in one node)."""

from __future__ import annotations

import operator
from typing import Annotated, Any, NotRequired, TypedDict

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send, interrupt

from keeper_middleware import Keeper, KeeperGraphState, KeeperNode
from tests.branch_runs import answer_with_rules
from tests.fake_model import ScriptedChatModel
from tests.story_model import StoryModel


class Pair(TypedDict):
    research: str
    write: str
    replies: Annotated[list[str], operator.add]


class Batch(TypedDict):
    texts: list[str]
    batches: NotRequired[list[list[str]]]


class Desk(TypedDict):
    ask: str
    ask_id: str
    replies: Annotated[list[str], operator.add]


@tool
def sign_off(what: str) -> str:
    """Ask a person to sign something off."""
    return f"signed: {interrupt(f'sign off {what}?')}"


def signing(messages: list[Any]) -> AIMessage | str:
    """Asks for a sign-off when an input says so; otherwise the story model."""
    last = messages[-1]
    if isinstance(last, HumanMessage) and "sign-off" in str(last.content):
        call = {"name": "sign_off", "args": {"what": "it"}, "id": "call-sign"}
        return AIMessage("", tool_calls=[call])
    return StoryModel(answer=answer_with_rules)(messages)


class Fan(KeeperGraphState):
    persona: NotRequired[int]


PERSONAS = 3


def fan_graph(keeper: Keeper, saver: Any, *, send: bool) -> Any:
    """The keeper, then ``PERSONAS`` model calls: in parallel through ``Send``, or (the control)
    one after the other in one node, giving the same messages in the same order."""
    model = ScriptedChatModel(default=StoryModel(answer=answer_with_rules))
    node = KeeperNode(keeper, model=model)

    def reply(messages: list[Any], persona: int) -> AIMessage:
        said = model.invoke(messages).content
        return AIMessage(f"persona {persona}: {said}", id=f"{messages[-1].id}-p{persona}")

    def one(state: Fan) -> dict[str, Any]:
        return {"messages": [reply(state["messages"], state.get("persona", 0))]}

    def all_of(state: Fan) -> dict[str, Any]:
        return {"messages": [reply(state["messages"], p) for p in range(PERSONAS)]}

    def fan(state: Fan) -> list[Send]:
        return [Send("model", {**state, "persona": p}) for p in range(PERSONAS)]

    graph = StateGraph(Fan)
    graph.add_node("keeper", node.as_runnable())
    graph.add_node("model", one if send else all_of)
    graph.add_edge(START, "keeper")
    if send:
        graph.add_conditional_edges("keeper", fan, ["model"])
    else:
        graph.add_edge("keeper", "model")
    graph.add_edge("model", END)
    return graph.compile(checkpointer=saver)
