"""Every arm asks an empty reply once more, by the keeper's rule: a baseline, a self-editing arm
or a peer loses no whole question set to a fault the keeper's harness would have asked again,
and a set lost whole is reported apart from what a memory got wrong."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from keeper_bench.arms import build_arm
from keeper_bench.grader import grade
from keeper_bench.report import lost_sets_table
from keeper_middleware.testing import ScriptedChatModel

ARMS = (
    "notes",
    "window_drop",
    "compaction",
    "summarize",
    "rag",
    "free_notes",
    "peer_langchain_summarization_tuned",
    "peer_langmem_summarization_tuned",
    "peer_deepagents",
    "peer_deepagents_tuned",
)


def _last_reply(values: dict[str, Any]) -> str:
    replies = [m for m in values["messages"] if isinstance(m, AIMessage)]
    return str(replies[-1].content)


@pytest.mark.parametrize("name", ARMS)
def test_an_empty_reply_is_asked_again_with_some_randomness_in_every_arm(name, tmp_path):
    model = ScriptedChatModel(script=["", "1. 42"])
    arm = build_arm(name, model, window=16_384, archive=tmp_path / "archive.sqlite3")
    try:
        values = arm.graph.invoke(
            {"messages": [HumanMessage("Questions:\n1. What value does domo86 hold now?")]},
            {"configurable": {"thread_id": "t"}},
        )
    finally:
        arm.close()
    assert _last_reply(values) == "1. 42"
    assert len(model.received) == 2
    first, again = model.received
    assert again.messages == first.messages  # the same request, asked once more
    assert again.kwargs.get("temperature") == 0.7


def test_a_reply_that_stands_is_not_asked_again(tmp_path):
    model = ScriptedChatModel(script=["1. 42"])
    arm = build_arm("window_drop", model, window=16_384)
    values = arm.graph.invoke(
        {"messages": [HumanMessage("Questions:\n1. What value does domo86 hold now?")]},
        {"configurable": {"thread_id": "t"}},
    )
    assert _last_reply(values) == "1. 42" and len(model.received) == 1


def _question_set(after: int, *answers: str) -> dict[str, Any]:
    return {
        "after_item": after,
        "final": False,
        "questions": [
            {"number": n, "answer": a, "category": "current", "bucket": "1–4"}
            for n, a in enumerate(answers, start=1)
        ],
    }


def test_a_set_lost_whole_is_counted_apart_from_memory_errors():
    sets = [_question_set(10, "5", "7"), _question_set(20, "1", "2", "3")]
    result = grade(sets, {(10, False): "1. 5\n2. 9", (20, False): ""}, reader="simulated reader")
    assert result.sets == 2
    assert result.lost_sets == (1, 3)  # the empty reply lost its three questions
    assert result.memory_errors == 1  # the 9 given for 7
    table = lost_sets_table([result])
    assert "| run 1 | 2 | 1 (3) | 1 |" in table and "simulated reader" in table
