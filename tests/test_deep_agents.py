"""Deep Agents: as a peer arm (its own context management, at its defaults and tuned) and as a
host for the keeper (``create_deep_agent(..., middleware=[KeeperMiddleware(...)])``)."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest
from langchain_core.callbacks import BaseCallbackHandler

from keeper_bench.reader.summary import DEEPAGENTS_SUMMARY_START
from keeper_bench.run_options import RunOptions, resolve_stream
from keeper_bench.runner import run_arm
from keeper_middleware.messages.facts import keeper_kind, text_of

pytest.importorskip("deepagents")
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


class Requests(BaseCallbackHandler):
    """Every request's texts, to see what the model was sent."""

    def __init__(self) -> None:
        self.sent: list[list[str]] = []

    def on_chat_model_start(self, serialized, messages, **kwargs):  # type: ignore[no-untyped-def]
        self.sent.append([text_of(m) for m in messages[0]])


def test_the_keeper_runs_inside_a_deep_agent_with_its_summariser_switched_off(monkeypatch, capsys):
    monkeypatch.delenv("KEEPER_BASE_URL", raising=False)
    monkeypatch.syspath_prepend(str(EXAMPLES))
    example = runpy.run_path(str(EXAMPLES / "deep_agent.py"))
    from middleware_agent import ScriptedClerk

    from keeper_middleware import Keeper, KeeperConfig

    keeper = Keeper(KeeperConfig(window=8192, reply_reserve=512))
    agent = example["build_agent"](ScriptedClerk(), keeper)
    names = [node for node in agent.get_graph().nodes]
    assert any("KeeperMiddleware" in name for name in names)
    assert not any("Summarization" in name for name in names)
    requests = Requests()
    config = {"configurable": {"thread_id": "t"}, "callbacks": [requests]}
    from langchain_core.messages import HumanMessage

    replies, streamed = [], []
    for text in example["conversation"](40):
        # as a chat UI streams it, subagents included: the keeper's messages never come
        inputs = {"messages": [HumanMessage(text)]}
        for _ns, (chunk, _meta) in agent.stream(
            inputs, config, stream_mode="messages", subgraphs=True
        ):
            streamed.append(chunk)
        reply = agent.get_state(config).values["messages"][-1]
        if text.startswith("Questions"):
            replies.append(text_of(reply))
    assert replies == ["1. 7", "1. 77", "1. 147", "1. 217"]  # found in the keeper's archive
    assert streamed and not [c for c in streamed if keeper_kind(c) or "[NOTES]" in text_of(c)]
    assert keeper.counters("t").cuts >= 5
    assert keeper.notes("t").rules == ("Report every amount in words, never in digits.",)
    assert not any(DEEPAGENTS_SUMMARY_START in text for sent in requests.sent for text in sent)
    assert max(sum(len(t) for t in sent) // 4 for sent in requests.sent) < 8192


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return resolve_stream("tiny:rules+overdrawn", tmp_path_factory.mktemp("stream"))


def test_deep_agents_as_an_arm_summarises_and_its_summaries_are_audited(tiny, tmp_path):
    versions = {}
    for arm in ("peer_deepagents", "peer_deepagents_tuned"):
        # 6,144 as the demo: at 4,096 Deep Agents' own prompt and tools leave no room for the
        # history file it offers to read back, and it raises ContextOverflowError
        options = RunOptions.create(arm=arm, stream=tiny, window=6144)
        result = run_arm(options, tmp_path / arm, progress=False)
        saved = (tmp_path / arm / "summaries.jsonl").read_text().splitlines()
        versions[arm] = [json.loads(line) for line in saved]
        assert result.audit is not None and result.audit["memory"] == "summary"
        assert result.audit["versions_audited"] == len(versions[arm]) >= 1
        assert result.grade.right > result.grade.asked // 2
    # tuned: summarised at 75% of the window rather than 85%, so at least as often
    assert len(versions["peer_deepagents_tuned"]) >= len(versions["peer_deepagents"])
