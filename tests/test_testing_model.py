"""``keeper_middleware.testing.ScriptedChatModel``: a keeper agent driven by a script, with every
call recorded, offline."""

from __future__ import annotations

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from keeper_middleware import (
    ArgumentTypeError,
    InvalidStateError,
    KeeperConfig,
    create_keeper_agent,
)
from keeper_middleware.testing import ScriptedChatModel, tool_call


@tool
def lookup(name: str) -> str:
    """Look a register up."""
    return f"{name} holds 9"


def test_a_scripted_tool_call_runs_and_every_call_is_recorded():
    model = ScriptedChatModel(script=[tool_call("lookup", name="domo03"), "domo03 holds 9."])
    agent = create_keeper_agent(model, [lookup], checkpointer=InMemorySaver())
    out = agent.invoke(
        {"messages": [HumanMessage("What does domo03 hold?")]},
        {"configurable": {"thread_id": "t"}},
    )
    assert out["messages"][-1].content == "domo03 holds 9."
    assert [m.type for m in out["messages"]] == ["human", "ai", "tool", "ai"]
    assert out["messages"][2].content == "domo03 holds 9"
    assert len(model.received) == 2
    # the keeper bound its archive search beside the user's tool, and sent the tool's result
    assert sorted(model.received[0].tools) == ["lookup", "search_archive"]
    assert model.received[1].messages[-1].type == "tool"


def test_a_reply_can_depend_on_what_was_sent_and_the_default_answers_after_the_script():
    model = ScriptedChatModel(
        script=[lambda messages: f"{len(messages)} messages"], default="again"
    )
    assert model.invoke([HumanMessage("a"), HumanMessage("b")]).content == "2 messages"
    assert model.invoke("c").content == "again"
    assert [len(r.messages) for r in model.received] == [2, 1]


def test_running_out_of_script_says_so():
    model = ScriptedChatModel(script=["one"])
    model.invoke("x")
    with pytest.raises(InvalidStateError, match="ran out after 2 calls"):
        model.invoke("y")


def test_tool_call_ids_are_stable_and_differ_by_arguments():
    first = tool_call("search_archive", query="domo03")
    assert (
        first.tool_calls[0]["id"] == tool_call("search_archive", query="domo03").tool_calls[0]["id"]
    )
    assert first.tool_calls[0]["id"] != tool_call("search_archive", query="x").tool_calls[0]["id"]
    assert first.tool_calls[0]["args"] == {"query": "domo03"}


def test_it_counts_tokens_offline_so_it_can_size_the_window():
    model = ScriptedChatModel(default="ok")
    agent = create_keeper_agent(
        model,
        config=KeeperConfig(window=2048),
        token_counter=model,
        checkpointer=InMemorySaver(),
    )
    for item in range(1, 40):
        agent.invoke(
            {"messages": [HumanMessage(f"Item {item}. " + "A long line of story. " * 20)]},
            {"configurable": {"thread_id": "t"}},
        )
    assert agent.keeper.counters("t").cuts >= 1


def test_a_script_entry_that_is_not_a_reply_is_refused_by_name():
    model = ScriptedChatModel(script=[lambda messages: 42])
    with pytest.raises(ArgumentTypeError, match="script entry must be an AIMessage"):
        model.invoke("x")
