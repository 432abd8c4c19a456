"""The simulated reader knows only what its context holds, and says so: it answers from the
batches in view, a fact removed from the context is unknown, a rule applies only when the story,
the NOTES or the RULES block carries it, and current values replay the NOTES and later batches
(kept messages not twice) plus any retrieved passages."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from keeper_bench.reader import SimulatedReader
from keeper_middleware.notes.block import Notes
from tests.reader_stories import (
    ALL_QUESTIONS,
    CONFIDENTIAL,
    ITEM_2,
    OVERDRAWN,
    TALLY,
    answers,
    item_1,
    notes_message,
    questions,
    story,
)


def test_it_answers_from_the_batches_in_view():
    reply = SimulatedReader().invoke([*story(item_1(TALLY), ITEM_2), questions(*ALL_QUESTIONS)])
    assert answers(reply) == {1: "328", 2: "342", 3: "Tomas Quill", 4: str(328 * 5 + 13), 5: "-4"}


def test_a_fact_removed_from_the_context_is_unknown():
    # Item 1 (where domo86 and kibu12 were set) is gone: the reader must not know them.
    reply = SimulatedReader().invoke([*story(ITEM_2), questions(*ALL_QUESTIONS)])
    assert answers(reply) == {
        1: "unknown",
        2: "unknown",
        3: "Tomas Quill",
        4: "unknown",
        5: "unknown",
    }


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("nowhere", "40"),
        ("story", "protected"),
        ("notes", "protected"),
        ("rules block", "protected"),
    ],
)
def test_a_rule_applies_only_when_it_is_in_the_context(where, expected):
    rules = (CONFIDENTIAL,) if where == "story" else ()
    history = story(item_1(*rules))
    if where == "notes":
        history = [
            history[0],
            history[1],
            notes_message(
                Notes(rules=(CONFIDENTIAL,), state=(("kelo12", "40"),), first_item=1, last_item=1)
            ),
        ]
    history.append(
        questions("What value does kelo12 hold now?", "What is the tally of kelo12 now?")
    )
    if where == "rules block":
        history.append(
            HumanMessage(
                f"[RULES] Rules in force (from the NOTES):\n- {CONFIDENTIAL}",
                additional_kwargs={"keeper": "rules"},
            )
        )
    reply = SimulatedReader().invoke(history)
    tally = "protected" if expected == "protected" else "unknown"  # no method in context
    assert answers(reply) == {1: expected, 2: tally}


def test_below_zero_is_overdrawn_only_under_the_rule():
    asked = questions("What value does kibu12 hold now?", "What is the tally of kibu12 now?")
    with_rule = SimulatedReader().invoke([*story(item_1(TALLY, OVERDRAWN), ITEM_2), asked])
    without = SimulatedReader().invoke([*story(item_1(TALLY), ITEM_2), asked])
    assert answers(with_rule) == {1: "overdrawn", 2: "overdrawn"}
    assert answers(without) == {1: "-4", 2: str(-4 * 5 + 13)}


def test_current_values_replay_the_notes_and_later_batches_but_not_kept_messages_twice():
    notes = Notes(state=(("domo86", "342"), ("kibu12", "5")), first_item=1, last_item=1)
    kept_batch = "Item 1.\nMira Holt took 3 from domo86."  # already in the NOTES' 342
    history = [
        SystemMessage("s"),
        HumanMessage("task"),
        notes_message(notes, kept=2),
        HumanMessage(kept_batch),
        AIMessage("Read item 1."),
        HumanMessage(ITEM_2),
        AIMessage("Read item 2."),
        questions("What value does domo86 hold now?"),
    ]
    assert answers(SimulatedReader().invoke(history)) == {1: "328"}


def test_retrieved_passages_add_what_the_window_lost():
    passages = HumanMessage(
        "Passages from the archive:\nitem 1: The clerk recorded domo86 at three hundred and forty-two. → next: Mira Holt recorded kibu12 at 5.\n"
        "item 1: Mira Holt recorded kibu12 at 5. → next: The market was quiet."
    )
    history = [*story(ITEM_2), passages, questions("What value does domo86 hold now?")]
    assert answers(SimulatedReader().invoke(history)) == {1: "328"}
