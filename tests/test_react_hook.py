"""The keeper as create_react_agent's pre_model_hook (deprecated in LangGraph v1, still used)."""

from __future__ import annotations

import asyncio

import pytest
from langchain_core.messages import HumanMessage
from langgraph.graph.message import REMOVE_ALL_MESSAGES

from keeper_middleware import Keeper
from keeper_middleware.integrations.langchain import keeper_pre_model_hook
from keeper_middleware.messages.facts import keeper_kind
from tests.test_integrations_parity import (
    CONFIG,
    SYSTEM,
    THREAD,
    TOOLS,
    archive_contents,
    inspect,
    react_agent,
    run,
    scenario,
    scripted_model,
    thread,
)

pytestmark = pytest.mark.filterwarnings(
    "ignore:create_react_agent has been moved:langgraph.warnings.LangGraphDeprecatedSinceV10"
)

TURNS = 40


def test_a_cut_rewrites_the_checkpointed_messages_and_leaves_no_model_view_behind():
    model, keeper = scripted_model(), Keeper(CONFIG)
    agent = react_agent(model, keeper)
    run(agent, scenario(TURNS))
    values = agent.get_state(thread()).values
    assert keeper.counters(THREAD).cuts >= 3
    assert keeper_kind(values["messages"][1]) == "notes"
    assert len(values["messages"]) < TURNS
    assert not values.get("llm_input_messages")
    assert inspect(model, keeper).problems == []


def test_the_hook_returns_messages_updates_only():
    model, keeper = scripted_model(), Keeper(CONFIG)
    hook = keeper_pre_model_hook(model, tools=TOOLS, system_prompt=SYSTEM, keeper=keeper)
    assert [t.name for t in hook.tools] == ["lookup", "search_archive"]
    assert hook.keeper is keeper
    texts = list(scenario(12))
    messages = [HumanMessage(t, id=f"m{i}") for i, t in enumerate(texts)]
    update = hook.invoke({"messages": messages}, thread())
    assert set(update) == {"keeper", "messages"}
    assert update["messages"][0].id == REMOVE_ALL_MESSAGES
    again = hook.invoke({"messages": update["messages"][1:], "keeper": update["keeper"]}, thread())
    assert set(again) == {"keeper"}


def test_ainvoke_archives_what_invoke_does():
    reference = Keeper(CONFIG)
    run(react_agent(scripted_model(), reference), scenario(TURNS))
    model, keeper = scripted_model(), Keeper(CONFIG)
    agent = react_agent(model, keeper)

    async def arun() -> None:
        for text in scenario(TURNS):
            await agent.ainvoke({"messages": [HumanMessage(text)]}, thread())

    asyncio.run(arun())
    assert archive_contents(keeper) == archive_contents(reference)
    assert inspect(model, keeper).problems == []
