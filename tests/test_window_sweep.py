"""Every window from 2K to 1M works with the defaults: the reply reserve scales with the window,
no request is larger than the window minus that reserve, cuts happen and old facts are found."""

from __future__ import annotations

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from keeper_middleware import ConfigurationError, KeeperConfig, create_keeper_agent
from keeper_middleware.config import scaled_reply_reserve
from keeper_middleware.keeper import ModelSetup
from keeper_middleware.messages.facts import text_of
from keeper_middleware.search.tool import archive_search_tool
from tests.test_integrations_parity import SYSTEM, THREAD, TOOLS, scenario, scripted_model, thread

WINDOWS = [2048, 3000, 4096, 8192, 32_768, 131_072, 1_000_000]


@pytest.mark.parametrize("window", WINDOWS)
def test_a_window_works_with_the_defaults(window):
    config = KeeperConfig(window=window)
    assert 0 < config.reserve <= 4096 and config.reserve < window // 2
    model = scripted_model()
    agent = create_keeper_agent(
        model, TOOLS, system_prompt=SYSTEM, config=config, checkpointer=InMemorySaver()
    )
    replies = []
    for text in scenario(28):
        out = agent.invoke({"messages": [HumanMessage(text)]}, thread())
        replies.append(text_of(out["messages"][-1]))
    keeper = agent.keeper
    schemas = ModelSetup(tools=(*TOOLS, archive_search_tool(keeper))).tool_schemas
    sizes = [keeper.tokens.count_messages(r.messages, schemas) for r in model.received]
    assert max(sizes) <= config.budget
    assert keeper.counters(THREAD).cuts >= 2  # every 10 items, whatever the window
    # the questions (every 7th turn) about items already archived were answered from the archive
    assert [r for r in replies if r.startswith("1. ") and "cannot" not in r]


def test_the_reserve_scales_and_an_explicit_one_wins():
    assert [scaled_reply_reserve(w) for w in (2048, 4096, 8192, 32_768, 1_000_000)] == [
        256,
        512,
        1024,
        4096,
        4096,
    ]
    assert KeeperConfig(window=8192, reply_reserve=300).reserve == 300
    assert KeeperConfig(window=8192).budget == 8192 - 1024


def test_a_reserve_of_half_the_window_says_what_would_pass():
    with pytest.raises(ConfigurationError, match=r"use at most 4095 .*or leave it unset"):
        KeeperConfig(window=8192, reply_reserve=4096)
    assert KeeperConfig(window=8192, reply_reserve=4095).budget == 4097
