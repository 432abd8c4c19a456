"""A step that only appends decides as a step that walks the whole window, while the NOTES it
works beside change: note calls answered by a scripted chat model write RULES from the user's
instructions, so cuts come due, the RULES grow, and each new question gets the RULES of its
moment placed beside it.

Two keepers run the same random sequence of appends (inputs, instructions, new questions, tool
rounds, replies), edits, regenerates and truncations. One takes the append path whenever it may
(the keeper as keeper-proxy builds it: ``unchanged_in_place``); the other never does. Their
windows, states, flags, counters, note requests and work-call kwargs must be equal at every
step. What the append path works out once and keeps (what the RULES beside a question cost,
the least a new message's cap may be) is pinned against the values worked out afresh.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    messages_to_dict,
)

from keeper_middleware import KeeperConfig
from keeper_middleware.messages.facts import keeper_kind
from keeper_middleware.notes.block import Notes
from keeper_middleware.reinjection.additions import render_rules_block
from keeper_middleware.step.excerpts import MIN_EXCERPT_TOKENS, excerpt_ref, pointer_cost
from keeper_middleware.step.result import StepResult
from keeper_middleware.testing import ScriptedChatModel
from tests import test_step_tail as tail

CUTTING = KeeperConfig(window=2048, reply_reserve=256, notes_every_items=4)
"""Cuts every few items: the RULES change between appends."""
KINDS = (
    *("input", "instruction", "question", "tool", "reply", "tools"),
    *("input", "instruction", "question", "tool", "reply"),
    *("edit", "regenerate", "truncate"),
)
OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(KINDS),
        st.lists(st.sampled_from(tail.WORDS), min_size=1, max_size=16).map(" ".join),
        st.integers(0, 999),
    ),
    min_size=4,
    max_size=14,
)


INSTRUCTIONS = (
    "Always count the parcels in crates.",
    "Never round the ledger totals.",
    "Always write harbour names in capitals.",
    "Report every overdrawn account first.",
    "Always give the clerk's figures in euros.",
)
"""What the user tells the agent to do from now on: each a RULE once noted."""


def _note_reply(messages: list[BaseMessage]) -> str:
    """The notes a careful model writes: a RULE for each instruction in the turns it notes."""
    said = {
        m.content
        for m in messages
        if isinstance(m, HumanMessage) and isinstance(m.content, str) and keeper_kind(m) is None
    }
    rules = [f"RULE: {text}" for text in INSTRUCTIONS if text in said]
    return "\n".join(rules) or "NO CHANGES"


class Arm(tail.Arm):
    """``tail.Arm`` whose note calls a scripted chat model answers, writing RULES."""

    def __init__(self, *, fast: bool) -> None:
        super().__init__(tail=fast, config=CUTTING, unchanged=fast)
        self.model = ScriptedChatModel(default=_note_reply)

    def note_call(self, messages: list[BaseMessage], kwargs: Any) -> AIMessage:
        self.requests.append(messages_to_dict(messages))
        return self.model.invoke(messages)

    def apply(self, kind: str, text: str, number: int) -> None:
        if kind == "instruction":
            self.history.append(HumanMessage(INSTRUCTIONS[number % 5], id=f"rule-{number}"))
        else:
            super().apply(kind, text, number)


def _run(ops: Sequence[tuple[str, str, int]]) -> tuple[Arm, Arm]:
    fast, full = tail.compare((Arm(fast=True), Arm(fast=False)), ops, _outcome)
    assert isinstance(fast, Arm) and isinstance(full, Arm)
    return fast, full


same_secret = tail.same_secret
"""Every keeper's sessions get the same secret, so two keepers' messages compare equal."""


def _outcome(arm: tail.Arm, result: StepResult) -> dict[str, Any]:
    return {**tail._outcome(arm, result), "notes": arm.keeper.notes("s").rules}


@tail.SEQUENCES
@given(ops=OPERATIONS)
def test_the_append_path_decides_as_the_full_path_while_the_rules_change(
    ops: list[tuple[str, str, int]], same_secret: None
) -> None:
    _run(ops)


def test_questions_after_new_rules_get_the_new_rules_on_the_append_path(
    same_secret: None,
) -> None:
    ops = [
        (kind, "alpha bravo", n)
        for n, kind in enumerate(
            ["instruction", "input", "question", "reply", "tool", "input", "input"] * 4
        )
    ]
    fast, full = _run(ops)
    assert fast.tail_steps > 0  # some steps appended
    assert len(fast.keeper.notes("s").rules) >= 2  # the RULES changed between them
    assert fast.keeper.counters("s").rules_injected == full.keeper.counters("s").rules_injected
    assert fast.keeper.counters("s").rules_injected > 0


def test_what_the_rules_beside_a_question_cost_follows_the_rules() -> None:
    window = tail.Arm(tail=True, config=CUTTING).keeper.window
    counter = window.tokens
    for rules in [(), ("Always count in euros.",), ("Always count in euros.", "Round down."), ()]:
        expected = counter.count_text(render_rules_block(rules)) + 8 if rules else 0
        assert window.beside_cost(Notes(rules=rules)) == expected


def test_the_least_cap_of_a_new_message_is_the_session_s_own() -> None:
    window = tail.Arm(tail=True, config=CUTTING).keeper.window
    for session in ("s", "another", "s"):
        ref = excerpt_ref(session, "x")
        expected = MIN_EXCERPT_TOKENS + pointer_cost(ref, window.tokens.count_text)
        assert window.excerpt_floor(session) == expected
