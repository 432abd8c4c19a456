"""A LangChain vector store is one argument away: the keeper indexes its archive into it and the
search tool finds old facts through it."""

from __future__ import annotations

import re

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.vectorstores import InMemoryVectorStore
from langgraph.checkpoint.memory import InMemorySaver

from keeper_middleware import create_keeper_agent
from keeper_middleware.messages.facts import text_of
from keeper_middleware.retrievers import VectorStoreRetriever
from tests.test_integrations_parity import (
    CONFIG,
    SYSTEM,
    THREAD,
    TOOLS,
    amount,
    scenario,
    scripted_model,
    thread,
)
from tests.test_retrievers_contract import HashingEmbeddings, langchain_chroma


@pytest.mark.parametrize("store", ["in-memory", "chroma"])
def test_the_agent_finds_archived_facts_through_a_langchain_vector_store(store, tmp_path):
    vectors = (
        InMemoryVectorStore(HashingEmbeddings())
        if store == "in-memory"
        else langchain_chroma(tmp_path)
    )
    agent = create_keeper_agent(
        scripted_model(),
        TOOLS,
        system_prompt=SYSTEM,
        config=CONFIG,
        retriever=vectors,
        checkpointer=InMemorySaver(),
    )
    assert isinstance(agent.keeper.retriever, VectorStoreRetriever)
    answers = {}
    for text in scenario(45):
        reply = agent.invoke({"messages": [HumanMessage(text)]}, thread())
        asked = re.search(r"What was r(\d+) recorded", text)
        if asked:
            answers[int(asked.group(1))] = text_of(reply["messages"][-1])
    counters = agent.keeper.counters(THREAD)
    assert counters.cuts >= 3 and counters.searches >= 3
    assert agent.keeper.retriever.count(THREAD) > 0
    found = {item: a for item, a in answers.items() if a == f"1. {amount(item)}"}
    assert len(found) == len(answers)  # every question about an archived item was answered right
