"""Retrieved passages help a question and never crowd out what the window holds.

The passages ``show_retrieved`` places beside a question are archived text shown again. On the
demo streams they took a fixed quarter of the budget and stayed in view after the answer: the
question's own search results then passed the budget sooner: cuts in the middle of the turn,
evidence archived and searched for again, the search budget spent. These tests pin the rules
that replaced that: the passages take only the room free under the notes threshold when the
question arrives, and once the question's work outgrows the window they leave view before a cut
takes any of it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from keeper_middleware import Keeper, KeeperConfig, ModelSetup
from keeper_middleware.messages.facts import keeper_kind, text_of
from tests.test_keeper_lessons import archive_with

CONFIG = KeeperConfig(window=2048, reply_reserve=256, notes_every_items=None, show_retrieved=40)
"""Budget 1,792 tokens, notes threshold 1,433; passages at most a quarter of the budget (448)."""
WIDE = replace(CONFIG, window=4096)
"""Budget 3,840, notes threshold 3,072: room for a long history before a first cut."""
SETUP = ModelSetup()
QUESTION = "Questions: where was c1 seen? where was c2 seen?"


def _note_call(messages: list[BaseMessage], kwargs: Any) -> AIMessage:
    return AIMessage(content="NO CHANGES")


SEEN = [(i, f"c{1 + i % 2} was seen near the old mill on day {i}.") for i in range(1, 200)]
HEAD = f"seed-{len(SEEN)}-s-seed-0"
"""The branch the seeded cut made (``archive_with`` names its cut so)."""


def _seeded_keeper(config: KeeperConfig = CONFIG) -> Keeper:
    """A keeper whose archive holds many sentences about c1 and c2 (as earlier cuts left it)."""
    keeper = Keeper(config)
    archive_with(keeper, "s", SEEN)
    return keeper


def _search_round(n: int) -> list[BaseMessage]:
    text = f"Result {n}: " + " ".join(f"c{n} was moved by the clerk on day {d}." for d in range(14))
    call = AIMessage(
        "",
        id=f"call{n}",
        tool_calls=[{"name": "lookup", "args": {"n": n}, "id": f"t{n}", "type": "tool_call"}],
    )
    return [call, ToolMessage(text, tool_call_id=f"t{n}", id=f"r{n}", name="lookup")]


def _results_in_view(messages: list[BaseMessage]) -> list[int]:
    return [
        int(str(m.id)[1:]) for m in messages if isinstance(m, ToolMessage) and str(m.id)[0] == "r"
    ]


def _passages(messages: list[BaseMessage]) -> list[BaseMessage]:
    return [m for m in messages if keeper_kind(m) == "retrieved"]


def _asked(keeper: Keeper, before: list[BaseMessage]) -> tuple[list[BaseMessage], dict[str, Any]]:
    """The window and state after the question arrives (on the branch the seeded cut made)."""
    messages = [HumanMessage("Task: answer questions about the counters.", id="task"), *before]
    result = keeper.step(
        "s", [*messages, HumanMessage(QUESTION, id="q")], {"head": HEAD}, SETUP, _note_call
    )
    return list(result.messages), dict(result.state)


def test_an_open_questions_passages_leave_view_before_a_cut_takes_any_of_its_work():
    keeper = _seeded_keeper()
    messages, state = _asked(keeper, [])
    assert _passages(messages), "the passages stand beside the question"
    went_over = False
    for n in range(1, 10):
        messages = [*messages, *_search_round(n)]
        size = keeper.window.count(SETUP, messages)
        result = keeper.step("s", messages, state, SETUP, _note_call)
        messages, state = list(result.messages), dict(result.state)
        if size <= CONFIG.budget:
            assert _passages(messages), f"{size} tokens fit the budget: the passages stay"
            continue
        went_over = True
        assert not result.cut, "taking the passages out of view made room: no cut"
        assert not _passages(messages)
        assert _results_in_view(messages) == list(range(1, n + 1)), "every result stays"
        assert keeper.window.count(SETUP, messages) <= CONFIG.budget
        break
    assert went_over, "the question's work must outgrow the budget with the passages in view"


def _batches(count: int) -> list[BaseMessage]:
    return [
        HumanMessage(
            f"Item {n}. " + " ".join(f"c{n} went up by {d} at the quay." for d in range(9)),
            id=f"b{n}",
        )
        for n in range(1, count + 1)
    ]


def test_passages_take_only_the_room_left_under_the_notes_threshold():
    keeper = _seeded_keeper(WIDE)
    messages, _ = _asked(keeper, _batches(24))
    block = _passages(messages)
    without = [m for m in messages if keeper_kind(m) != "retrieved"]
    left = WIDE.notes_threshold - keeper.window.count(SETUP, without)
    assert 0 < left < WIDE.budget // 4, "the history must leave less than a quarter free"
    assert block, "some passages fit"
    assert keeper.tokens.count_text(text_of(block[0])) <= left


def test_no_passage_that_fits_shows_no_block_rather_than_no_match():
    keeper = _seeded_keeper(WIDE)
    messages, _ = _asked(keeper, _batches(30))
    assert keeper.counters("s").cuts == 0
    assert keeper.window.count(SETUP, messages) > WIDE.notes_threshold
    assert not _passages(messages), "no room: no passages, and no false 'nothing matches'"
