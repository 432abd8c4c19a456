"""The ``keeper_middleware`` loggers (one a module, ``getLogger(__name__)``) write one record per decision: each step's sizes (DEBUG),
each cut and NOTES version, each re-ask and refused search (INFO), an oversized message and an
unusable notes reply (WARNING)."""

from __future__ import annotations

import logging
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from keeper_middleware import KeeperConfig, create_keeper_agent
from keeper_middleware.messages.facts import keeper_kind
from tests.test_integrations_parity import (
    SYSTEM,
    THREAD,
    TOOLS,
    ClerkModel,
    clerk,
    scenario,
    thread,
)


def records(caplog: Any, word: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name.split(".")[0] == "keeper_middleware" and r.getMessage().startswith(word)
    ]


def clerk_with_one_bad_note_reply() -> ClerkModel:
    said = {"bad": False}

    def reply(messages: list[BaseMessage]) -> Any:
        if keeper_kind(messages[-1]) == "notes_request" and not said["bad"]:
            said["bad"] = True
            return "SET r1 = 999999"
        return clerk(messages)

    return ClerkModel(default=reply)


def test_every_decision_is_one_record(caplog):
    caplog.set_level(logging.DEBUG, logger="keeper_middleware")
    agent = create_keeper_agent(
        clerk_with_one_bad_note_reply(),
        TOOLS,
        system_prompt=SYSTEM,
        config=KeeperConfig(window=8192),
        checkpointer=InMemorySaver(),
    )
    texts = list(scenario(30))
    texts.insert(5, "Item 5. A long letter arrived. " + "It rambled on about the weather. " * 600)
    for text in texts:
        agent.invoke({"messages": [HumanMessage(text)]}, thread())
    agent.keeper.search(THREAD, "   ")
    counters = agent.keeper.counters(THREAD)

    assert len(records(caplog, "cut ")) == counters.cuts >= 2
    assert len(records(caplog, "notes ")) == counters.cuts
    assert len(records(caplog, "reask ")) == counters.reasks >= 1
    assert len(records(caplog, "search refused")) == 1
    assert len(records(caplog, "step ")) >= len(texts)
    (oversized,) = records(caplog, "oversized message")
    assert oversized.levelno == logging.WARNING and "tokens=" in oversized.getMessage()
    cut = records(caplog, "cut ")[0].getMessage()
    assert f"session={THREAD}" in cut and "archived=" in cut and "window_tokens=" in cut
