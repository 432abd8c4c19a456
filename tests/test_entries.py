"""A message is classified once per step: every decision reads the same answers, worked out once."""

from collections.abc import Sequence
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from keeper_middleware import Keeper, KeeperConfig, ModelSetup
from keeper_middleware.messages.facts import keeper_kind, keeper_message, text_of
from keeper_middleware.reinjection.questions import PatternQuestionDetector
from keeper_middleware.step.entries import classify
from keeper_middleware.tokens.counting import ApproximateTokenCounter


class CountingCounter:
    """The default counter, recording each message it was asked to size on its own."""

    def __init__(self) -> None:
        self.inner = ApproximateTokenCounter()
        self.single: list[str] = []

    def count_messages(
        self, messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]] = ()
    ) -> int:
        if len(messages) == 1 and not tools:
            self.single.append(str(messages[0].id))
        return self.inner.count_messages(messages, tools)

    def count_text(self, text: str) -> int:
        return self.inner.count_text(text)


def conversation() -> list[BaseMessage]:
    return [
        SystemMessage(content="Answer briefly.", id="sys"),
        HumanMessage(content="Questions:\n1. What is alpha7 now?", id="q"),
        AIMessage(content="", tool_calls=[{"name": "t", "args": {}, "id": "c1"}], id="call"),
        ToolMessage(content="alpha7 is 12", tool_call_id="c1", name="t", id="result"),
        keeper_message("[RULES] Report negatives as overdrawn.", "rules", msg_id="r"),
        HumanMessage(content=[{"type": "text", "text": "part one "}, "part two"], id="parts"),
    ]


def test_an_entry_answers_as_the_message_helpers_do():
    counter = ApproximateTokenCounter()
    detector = PatternQuestionDetector([r"^Questions:"])
    for entry in classify(conversation(), counter, detector):
        assert entry.kind == keeper_kind(entry.message)
        assert entry.text == text_of(entry.message)
        assert entry.tokens == counter.count_messages([entry.message])
        assert entry.question == detector.is_question(entry.message)
    kinds = {e.id: e.kind for e in classify(conversation(), counter, detector)}
    assert kinds == {
        "sys": None,
        "q": None,
        "call": None,
        "result": None,
        "r": "rules",
        "parts": None,
    }


def test_a_message_is_sized_once_however_often_it_is_asked():
    counter = CountingCounter()
    entries = classify(conversation(), counter, PatternQuestionDetector([r"^Questions:"]))
    for _ in range(3):
        sizes = [entry.tokens for entry in entries]
    assert sorted(counter.single) == sorted(e.id for e in entries)
    assert sizes == [counter.inner.count_messages([e.message]) for e in entries]


def test_classifying_again_keeps_the_entries_of_unchanged_messages_only():
    counter = ApproximateTokenCounter()
    detector = PatternQuestionDetector([r"^Questions:"])
    messages = conversation()
    first = classify(messages, counter, detector)
    replaced = messages[3].model_copy(update={"content": "alpha7 is 13"})
    again = classify([*messages[:3], replaced, *messages[4:]], counter, detector, known=first)
    assert [a is b for a, b in zip(first, again, strict=True)] == [
        True,
        True,
        True,
        False,
        True,
        True,
    ]
    assert again[3].text == "alpha7 is 13"


@pytest.mark.parametrize("window", [2_048, 8_192])
def test_a_step_sizes_each_message_in_view_at_most_once_before_a_cut(window):
    """Taking a message in, fitting it, and sizing the room used to count it up to four times."""
    counter = CountingCounter()
    keeper = Keeper(KeeperConfig(window=window), token_counter=counter)
    messages: list[BaseMessage] = [HumanMessage(content="Keep a tally of the counters.", id="task")]
    state: dict[str, Any] = {}
    for i in range(5):
        messages.append(
            HumanMessage(content=f"Batch {i}: alpha{i} was recorded at {i * 7}.", id=f"b{i}")
        )
        counter.single.clear()
        result = keeper.step("s", messages, state, ModelSetup(), lambda m, k: AIMessage(content=""))
        assert not result.cut
        assert f"b{i}" in counter.single
        assert len(counter.single) == len(set(counter.single)), counter.single
        messages, state = [*result.messages, AIMessage(content="Noted.", id=f"a{i}")], result.state
