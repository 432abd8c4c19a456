"""The simulated reader is a LangChain chat model, labelled a simulated reader and never a
language model: it is stateless and deterministic, reports usage, binds tools as a copy and
records the reasoning effort, reads batches through a tool in tool mode (inside a LangChain agent
too), and gives the same replies sync and async."""

from __future__ import annotations

import pytest
from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage

from keeper_bench import reader as reader_module
from keeper_bench.reader import SimulatedReader
from tests.reader_stories import (
    ALL_QUESTIONS,
    ITEM_2,
    READ_TOOL,
    SEARCH_TOOL,
    TALLY,
    answers,
    item_1,
    questions,
    story,
)


def test_it_is_labelled_a_simulated_reader_not_a_language_model():
    reader = SimulatedReader()
    reply = reader.invoke([HumanMessage("Hello.")])
    assert reader._llm_type == "simulated-reader"
    assert reply.response_metadata["model_name"] == "simulated-reader"
    doc = reader_module.__doc__ or ""
    assert "NOT a language model" in doc and '"simulated reader"' in doc


def test_batches_are_acknowledged_and_read_through_the_tool_in_tool_mode():
    assert SimulatedReader().invoke(story(ITEM_2)[:3]).content == "Read item 2."
    reader = SimulatedReader().bind_tools([READ_TOOL, SEARCH_TOOL])
    task = [
        SystemMessage("s"),
        HumanMessage("Call read_next_batch until it says there are no more."),
    ]
    first = reader.invoke(task)
    assert [call["name"] for call in first.tool_calls] == ["read_next_batch"]
    batch = ToolMessage(ITEM_2, tool_call_id=first.tool_calls[0]["id"], name="read_next_batch")
    second = reader.invoke([*task, first, batch])
    assert [call["name"] for call in second.tool_calls] == ["read_next_batch"]
    done = ToolMessage(
        "No more batches for now.", tool_call_id=second.tool_calls[0]["id"], name="read_next_batch"
    )
    assert reader.invoke([*task, first, batch, second, done]).content == "Done reading."


def test_it_is_stateless_and_deterministic_and_reports_usage():
    reader = SimulatedReader().bind_tools([SEARCH_TOOL])
    history = [*story(ITEM_2), questions("What value does domo86 hold now?")]
    one, other = reader.invoke(history), reader.invoke(history)
    assert one.tool_calls == other.tool_calls and one.content == other.content
    usage = one.usage_metadata
    sent = sum(len(str(m.content)) for m in history)
    assert usage["input_tokens"] == pytest.approx(sent / 4, abs=len(history))
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert one.response_metadata == {
        "finish_reason": "tool_calls",
        "model_name": "simulated-reader",
    }


def test_bind_tools_returns_a_copy_and_reasoning_effort_is_recorded():
    reader = SimulatedReader()
    bound = reader.bind_tools([SEARCH_TOOL])
    assert reader.bound_tools == () and bound.bound_tools == ("search_archive",)
    reply = reader.invoke([HumanMessage("Hello.")], reasoning_effort="medium")
    assert reply.response_metadata["reasoning_effort"] == "medium"


def test_it_works_inside_a_langchain_agent_with_tools():
    from langchain.agents import create_agent
    from langchain_core.tools import tool

    batches = [item_1(TALLY), ITEM_2]

    @tool
    def read_next_batch() -> str:
        """Read the next batch of stories."""
        return batches.pop(0) if batches else "No more batches for now."

    agent = create_agent(SimulatedReader(), tools=[read_next_batch])
    result = agent.invoke(
        {"messages": [HumanMessage("Call read_next_batch until it says there are no more.")]}
    )
    assert result["messages"][-1].content == "Done reading."
    followup = agent.invoke(
        {"messages": [*result["messages"], questions("What is the tally of domo86 now?")]}
    )
    assert answers(followup["messages"][-1]) == {1: str(328 * 5 + 13)}


@pytest.mark.anyio
async def test_async_calls_give_the_same_replies():
    reader = SimulatedReader().bind_tools([SEARCH_TOOL])
    for history in (
        [*story(ITEM_2), questions(*ALL_QUESTIONS)],
        [*story(item_1(TALLY), ITEM_2), questions(*ALL_QUESTIONS)],
    ):
        sync, asynchronous = reader.invoke(history), await reader.ainvoke(history)
        assert (sync.content, sync.tool_calls) == (asynchronous.content, asynchronous.tool_calls)
