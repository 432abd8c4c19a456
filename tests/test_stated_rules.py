"""A standing rule the user stated reaches the RULES, and every question, whatever the note-taker
writes, through every entry point.

A note-taker that answered every note request with prose (no change lines), or rewrote the notes
without a NOTES block, left the RULES empty after three cuts: the rule survived only in the
archive and was never beside a question. Now the keeper reads the noted user turns itself and
carries a standing rule into the RULES word for word; it adds nothing that is no standing rule
(story sentences, encouragement, requests, the task's own opening instructions).
"""

from __future__ import annotations

import pytest
from langchain_core.messages import BaseMessage

from keeper_middleware import Keeper, KeeperConfig
from keeper_middleware.messages.facts import keeper_kind, text_of
from keeper_middleware.notes.block import Notes
from keeper_middleware.notes.standing import stated_rules, with_stated_rules
from tests.entry_points import ENTRY_POINTS, build
from tests.fake_model import ScriptedChatModel

pytestmark = pytest.mark.filterwarnings(
    "ignore:create_react_agent has been moved:langgraph.warnings.LangGraphDeprecatedSinceV10"
)
RULE = "From now on, always report every amount in euros."
TASK = "Task: keep the ledger. Always answer from the ledger."
PROSE = "I read the turns carefully; nothing much changed and the ledger looks fine."
TAKERS = {
    # change lines asked for, prose given at every ask and re-ask
    "prose": ("in_place", PROSE),
    # a full rewrite asked for, prose without a NOTES block given
    "rewrite-without-block": ("rewrite", PROSE),
    # a note-taker that writes the rule itself: it is not doubled
    "writes-the-rule": ("in_place", "RULE: always report every amount in euros."),
}


def note_taker(reply: str):
    def answer(messages: list[BaseMessage]) -> str:
        if keeper_kind(messages[-1]) in ("notes_request", "notes_reask"):
            return reply
        return "ok"

    return answer


@pytest.mark.parametrize("taker", list(TAKERS))
@pytest.mark.parametrize("kind", ENTRY_POINTS)
def test_a_stated_rule_reaches_the_rules_and_the_question_whatever_the_note_taker_writes(
    kind, taker
):
    mode, reply = TAKERS[taker]
    config = KeeperConfig(window=2048, reply_reserve=256, notes_every_items=3, notes_mode=mode)
    keeper = Keeper(config)
    model = ScriptedChatModel(default=note_taker(reply))
    entry = build(kind, model, keeper)
    entry.say(TASK)
    entry.say("Item 1. Mira set c1 to 3. " + RULE)
    for item in range(2, 14):
        entry.say(f"Item {item}. Mira set c{item} to {item * 3}. The ledger was checked again.")
    entry.say("Item 14. What is c3?")
    assert keeper.counters("t1").cuts >= 3
    state = entry.graph.get_state({"configurable": {"thread_id": "t1"}}).values
    rules = keeper.notes("t1", head=keeper.head_of("t1", state)).rules
    assert len([r for r in rules if "euros" in r]) == 1, rules
    assert RULE in rules or "always report every amount in euros." in rules
    # the opening instructions stay in view as the task; they never become a RULE
    assert not any("answer from the ledger" in r for r in rules)
    question = model.received[-1].messages
    beside = [m for m in question if keeper_kind(m) == "rules"]
    assert beside and "euros" in text_of(beside[-1])


@pytest.mark.parametrize(
    "text",
    [
        RULE,
        "Whenever you see a negative amount, report it as zero.",
        "You must never share the codes.",
        "Never round the figures.",
        "Item 4. Mira set c4 to 12. From now on, write every amount with two decimals.",
        "Standing rule: any figure below zero is reported as overdrawn.",
    ],
)
def test_a_standing_rule_is_recognised_as_written(text):
    found = stated_rules(text)
    assert len(found) == 1 and found[0] in text


@pytest.mark.parametrize(
    "text",
    [
        "I always go hiking on weekends.",
        "Mira never rounds her figures.",
        "Please fetch every site.",
        "Keep going and never give up!",
        "Whenever it rained, Mira stayed home.",
        "You never shy away from a challenge and always try something new.",
        "Never had a chance to visit it.",
        "What do you always order there?",
    ],
)
def test_what_is_no_standing_rule_is_never_carried(text):
    assert stated_rules(text) == []


def test_a_rule_held_already_or_reworded_is_not_added_again_and_the_cap_holds():
    notes = Notes(rules=("always report every amount in euros.",))
    assert with_stated_rules(notes, [RULE], max_rules=None) is notes
    more = ["From now on, never round the figures.", "From now on, always sign each reply."]
    assert with_stated_rules(notes, more, max_rules=2).rules == (
        "always report every amount in euros.",
        "From now on, never round the figures.",
    )
