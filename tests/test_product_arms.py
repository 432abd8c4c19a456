"""The product ships the prebuilt graphs a user compares in a notebook; the benchmark's own arms
(the peers, the self-editing arms) come with keeper-bench, whose registry builds both kinds."""

from __future__ import annotations

import pytest
from langchain_core.messages import HumanMessage

from keeper_middleware.errors import ArgumentTypeError, ConfigurationError
from keeper_middleware.graphs import arms as product
from keeper_middleware.testing import ScriptedChatModel

PRODUCT_ARMS = [
    "window_drop",
    "compaction",
    "summarize",
    "rag",
    "notes",
    "notes_retrieval",
    "notes_rewrite",
]


def test_the_product_builds_the_baselines_retrieval_and_the_keepers_arms():
    assert list(product.ARMS) == PRODUCT_ARMS
    for name in PRODUCT_ARMS:
        arm = product.build_arm(name, ScriptedChatModel(default="Read."), window=4096)
        reply = arm.graph.invoke(
            {"messages": [HumanMessage("Item 1. The ferry left at dawn.")]},
            {"configurable": {"thread_id": name}},
        )
        assert reply["messages"][-1].content == "Read.", name
        arm.close()


def test_a_benchmark_arm_asked_of_the_product_says_where_it_lives():
    with pytest.raises(ConfigurationError, match="keeper-bench distribution"):
        product.build_arm("peer_deepagents", ScriptedChatModel(), window=4096)
    with pytest.raises(ArgumentTypeError, match="keep_tool_results"):
        product.build_arm("notes", ScriptedChatModel(), window=4096, keep_tool_results=2)


def test_the_benchmarks_registry_builds_the_products_arms_through_the_product():
    from keeper_bench.arms import ARMS as EVERY_ARM
    from keeper_bench.arms import BENCH_ARMS
    from keeper_bench.arms import build_arm as build_any_arm

    assert list(EVERY_ARM) == [*PRODUCT_ARMS, *BENCH_ARMS]
    assert not set(BENCH_ARMS) & set(PRODUCT_ARMS)
    arm = build_any_arm("window_drop", ScriptedChatModel(default="Read."), window=4096)
    assert arm.description == product.ARMS["window_drop"].description
    arm.close()
    pinned = build_any_arm("self_edit", ScriptedChatModel(default="Read."), window=4096)
    assert pinned.memory_kind == "pinned"
    pinned.close()
    with pytest.raises(ConfigurationError, match="peer_deepagents_tuned") as unknown:
        build_any_arm("peer_unknown", ScriptedChatModel(), window=4096)
    assert "keeper-bench distribution" not in str(unknown.value)
