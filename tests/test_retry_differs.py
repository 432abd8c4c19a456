"""A retry that could not come out different is no retry: with no switch for thinking off, a
reply that thought to its limit is asked again with some randomness (asked the same way, a
server sampling greedily thought to its limit again and a whole question set was lost)."""

from __future__ import annotations

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver

from keeper_middleware import Keeper, KeeperConfig, ThinkingPolicy, create_keeper_agent
from keeper_middleware.messages.facts import text_of
from keeper_middleware.model.thinking import retry_of
from keeper_middleware.testing import ScriptedChatModel

THREAD: RunnableConfig = {"configurable": {"thread_id": "t1"}}


def _thought_to_limit() -> AIMessage:
    return AIMessage(
        "",
        response_metadata={"finish_reason": "length"},
        additional_kwargs={"reasoning_content": "hmm " * 100},
    )


def test_with_no_switch_for_thinking_off_the_retry_samples():
    model = ScriptedChatModel(script=[_thought_to_limit(), "the answer"])
    keeper = Keeper(KeeperConfig(window=4096, reply_reserve=512))
    agent = create_keeper_agent(model, keeper=keeper, checkpointer=InMemorySaver())
    out = agent.invoke({"messages": [HumanMessage("hello")]}, THREAD)
    assert text_of(out["messages"][-1]) == "the answer"
    first, again = model.received
    assert again.messages == first.messages
    assert again.kwargs != first.kwargs
    assert again.kwargs.get("temperature") == 0.7
    assert keeper.counters("t1").thinking_retries == 1


def test_a_switch_for_thinking_off_is_retry_enough():
    off = {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}
    decided = retry_of(ThinkingPolicy(off=off), {}, _thought_to_limit())
    assert decided == ("thinking_retries", off)
