"""The peers at their defaults and tuned: the tuned setting changes what a summary can keep."""

from __future__ import annotations

import pytest
from langchain_core.messages import BaseMessage, HumanMessage

from keeper_bench.arms import ARMS, PEER_SETTINGS, build_arm
from keeper_bench.arms.peers import langmem_summarization_graph
from keeper_middleware import KeeperConfig
from keeper_middleware.errors import ConfigurationError
from keeper_middleware.graphs.baselines import default_reply_reserve
from keeper_middleware.graphs.keeper_arms import notes_budget
from keeper_middleware.messages.facts import text_of
from tests.fake_model import Received, ScriptedChatModel
from tests.story_model import batch

WINDOW = 16_384
THREAD = {"configurable": {"thread_id": "t"}}


def _reply(messages: list[BaseMessage]) -> str:
    return "A short summary." if "summar" in text_of(messages[-1]).lower() else "ok"


def summary_calls(name: str, items: int = 40) -> list[Received]:
    """Drive the peer through ``items`` long batches; the calls that asked for a summary."""
    model = ScriptedChatModel(default=_reply)
    arm = build_arm(name, model, window=WINDOW)
    for item in range(1, items + 1):
        story = batch(item, f"Mira Holt set c{item} to {item}.", filler=100)
        arm.graph.invoke({"messages": [HumanMessage(story)]}, THREAD)
    arm.close()
    return [
        r
        for r in model.received
        if r.messages[-1].type == "human" and "summar" in text_of(r.messages[-1]).lower()
    ]


def sent_text(call: Received) -> str:
    return "\n".join(text_of(m) for m in call.messages)


def test_every_peer_has_a_default_and_a_tuned_arm():
    peers = {name for name in ARMS if name.startswith("peer_")}
    assert set(PEER_SETTINGS) == peers
    by_peer: dict[str, set[str]] = {}
    for peer, setting in PEER_SETTINGS.values():
        by_peer.setdefault(peer, set()).add(setting)
    assert by_peer and all(settings == {"defaults", "tuned"} for settings in by_peer.values())


def test_langchain_at_its_defaults_summarises_only_the_end_of_what_it_evicts():
    default = summary_calls("peer_langchain_summarization")
    tuned = summary_calls("peer_langchain_summarization_tuned")
    assert default and tuned
    # trim_tokens_to_summarize=4000: the oldest evicted item never reaches the summariser
    assert "Item 1." not in sent_text(default[0])
    assert "Item 1." in sent_text(tuned[0]) and "Item 2." in sent_text(tuned[0])


def test_langmem_tuned_gives_the_summary_the_keepers_notes_budget():
    default = summary_calls("peer_langmem_summarization")
    tuned = summary_calls("peer_langmem_summarization_tuned")
    assert default and tuned
    budget = notes_budget(KeeperConfig(window=WINDOW, reply_reserve=default_reply_reserve(WINDOW)))
    assert all("max_tokens" not in call.kwargs for call in default)
    assert all(call.kwargs.get("max_tokens") == budget for call in tuned)


@pytest.mark.parametrize("window", [8_192, 32_768, 131_072])
def test_the_notes_budget_is_a_share_of_the_window(window):
    config = KeeperConfig(window=window, reply_reserve=default_reply_reserve(window))
    budget = notes_budget(config)
    assert 0 < budget < config.budget // 4
    larger = KeeperConfig(window=2 * window, reply_reserve=default_reply_reserve(2 * window))
    assert notes_budget(larger) > budget


def test_a_summary_budget_that_leaves_no_room_is_refused_with_the_fix():
    model = ScriptedChatModel(default=_reply)
    with pytest.raises(ConfigurationError, match="summary_tokens"):
        langmem_summarization_graph(model, window=4096, reply_reserve=512, summary_tokens=4000)


def test_tuned_peers_ask_their_summaries_to_keep_every_rule(tmp_path):
    from langchain_core.messages import HumanMessage

    from keeper_bench.arms import build_arm
    from keeper_bench.arms.peers import RULES_KEPT
    from keeper_middleware.testing import ScriptedChatModel

    for name in (
        "peer_langchain_summarization_tuned",
        "peer_langmem_summarization_tuned",
        "peer_deepagents_tuned",
        "peer_langchain_summarization",
    ):
        model = ScriptedChatModel(default="Summary: kept.")
        arm = build_arm(name, model, window=8192)
        config = {"configurable": {"thread_id": "t"}}
        for n in range(1, 31):  # past the 75% trigger of an 8K window and LangChain's 20 kept
            arm.graph.invoke({"messages": [HumanMessage(f"Item {n}. " + "word " * 200)]}, config)
        asked = [m for call in model.received for m in call.messages[-1:]]
        summary_requests = [
            m for m in asked if isinstance(m, HumanMessage) and "summar" in str(m.content).lower()
        ]
        assert summary_requests, name  # the summariser ran
        keeps = any(RULES_KEPT in str(m.content) for m in summary_requests)
        assert keeps == name.endswith("_tuned"), name
