"""Each injected fault fires at rate 1, never at rate 0, and is reproducible by seed."""

from __future__ import annotations

import pytest
from langchain_core.messages import HumanMessage

from keeper_bench.reader import SimulatedReader
from keeper_bench.reader.faults import ReaderFaults
from keeper_middleware.notes.changes import RuleLine, SetLine, parse_changes
from tests.reader_stories import (
    CONFIDENTIAL,
    ITEM_2,
    OVERDRAWN,
    SEARCH_TOOL,
    TALLY,
    answers,
    item_1,
    notes_request,
    questions,
    search_result,
    story,
)

ASKED = questions(
    "What value does domo86 hold now?", "What value did domo86 hold at the end of item 1?"
)
ANSWERING = [*story(item_1(TALLY), ITEM_2), ASKED]
NOTING = [*story(item_1(TALLY), ITEM_2), notes_request()]
SEARCHING = [*story(ITEM_2), questions("What value did domo86 hold at the end of item 1?")]


def reader(**rates: float) -> SimulatedReader:
    return SimulatedReader(faults=ReaderFaults(seed=7, **rates))


def test_rates_outside_zero_to_one_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="between 0 and 1"):
        ReaderFaults(sign_flip=1.5)
    with pytest.raises(ValueError, match="seed must be an int"):
        ReaderFaults(seed="x")  # type: ignore[arg-type]


def test_misread_reads_a_set_with_the_wrong_sign_in_answers_and_notes():
    assert answers(reader(sign_flip=0).invoke(ANSWERING)) == {1: "328", 2: "342"}
    # Item 1 holds three sets; whichever is misread, the reply differs from the true one.
    misread_answers = reader(sign_flip=1).invoke(ANSWERING)
    misread_notes = parse_changes(str(reader(sign_flip=1).invoke(NOTING).content)).changes
    true_notes = parse_changes(str(reader(sign_flip=0).invoke(NOTING).content)).changes
    assert misread_notes != true_notes
    negated = [
        c
        for c in misread_notes
        if isinstance(c, SetLine) and (c.working or c.value).startswith("-")
    ]
    assert negated and all(c not in true_notes for c in negated)
    assert misread_answers.content == reader(sign_flip=1).invoke(ANSWERING).content  # reproducible


def test_misread_of_a_set_stated_outright_is_noted_as_its_negative():
    history = [*story("Item 5.\nThe clerk recorded dope10 at 342."), notes_request()]
    assert parse_changes(str(reader(sign_flip=1).invoke(history).content)).changes == (
        SetLine("dope10", "-342"),
    )


def test_empty_reply():
    empty = reader(empty_reply=1).invoke(ANSWERING)
    assert empty.content == "" and empty.tool_calls == []
    assert empty.response_metadata["finish_reason"] == "stop"
    assert reader(empty_reply=0).invoke(ANSWERING).content != ""


def test_think_to_limit_unless_thinking_is_switched_off():
    thought = reader(think_to_limit=1).invoke(ANSWERING)
    assert thought.content == "" and thought.response_metadata["finish_reason"] == "length"
    assert len(thought.additional_kwargs["reasoning_content"]) > 10_000
    assert thought.usage_metadata["output_tokens"] > 2_500
    for off in (
        {"reasoning_effort": "none"},
        {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}},
    ):
        assert answers(reader(think_to_limit=1).invoke(ANSWERING, **off)) == {1: "328", 2: "342"}
    assert reader(think_to_limit=0).invoke(ANSWERING).response_metadata["finish_reason"] == "stop"


def _after_first_result(model) -> list:
    history = list(SEARCHING)
    first = model.invoke(history)
    return [
        *history,
        first,
        search_result(
            first.tool_calls[0],
            'Found 1 match for "domo86".\nitem 1: Mira Holt took 2 from domo86. → next: The rain fell.',
        ),
    ]


def test_repeat_search_sends_the_same_search_again_after_its_results():
    faulty = reader(repeat_search=1).bind_tools([SEARCH_TOOL])
    history = _after_first_result(faulty)
    again = faulty.invoke(history)
    assert again.tool_calls[0]["args"] == history[-2].tool_calls[0]["args"]
    sane = reader(repeat_search=0).bind_tools([SEARCH_TOOL])
    assert sane.invoke(_after_first_result(sane)).tool_calls == []  # complete, no set: answers


def test_circle_searches_cycles_three_commands_until_the_stop_line():
    faulty = reader(circle_searches=1).bind_tools([SEARCH_TOOL])
    history = list(SEARCHING)
    sent = []
    for _ in range(6):
        reply = faulty.invoke(history)
        sent.append(tuple(sorted(reply.tool_calls[0]["args"].items())))
        history += [
            reply,
            search_result(reply.tool_calls[0], "Refused: that search was already made."),
        ]
    assert len(set(sent)) == 3 and sent[:3] == sent[3:]
    history.append(HumanMessage("Stop searching now and answer with what you have."))
    assert answers(faulty.invoke(history)) == {1: "unknown"}
    assert reader(circle_searches=0).bind_tools([SEARCH_TOOL]).invoke(SEARCHING).tool_calls[0][
        "args"
    ] == {"query": "domo86", "to_item": 1}


def _reask(history, reply) -> list:
    check = HumanMessage(
        "[NOTES CHECK] Some lines failed a check. Write all your change lines again, correcting these:\n- a line",
        additional_kwargs={"keeper": "notes_reask"},
    )
    return [*history, reply, check]


def test_drop_rules_reaches_the_reask_as_it_reaches_the_request():
    faulty = reader(drop_rules=1)
    first = faulty.invoke(NOTING)
    assert not any(isinstance(c, RuleLine) for c in parse_changes(str(first.content)).changes)
    again = parse_changes(str(faulty.invoke(_reask(NOTING, first)).content)).changes
    assert not any(isinstance(c, RuleLine) for c in again)  # a re-ask is no fault-free call
    assert (
        RuleLine(TALLY) in parse_changes(str(reader(drop_rules=0).invoke(NOTING).content)).changes
    )


def test_drop_rules_leaves_out_each_rule_on_its_own():
    history = [*story(item_1(CONFIDENTIAL, TALLY, OVERDRAWN), ITEM_2), notes_request()]
    kept_sets = set()
    for seed in range(40):
        model = SimulatedReader(faults=ReaderFaults(seed=seed, drop_rules=0.5))
        changes = parse_changes(str(model.invoke(history).content)).changes
        kept_sets.add(frozenset(c.text for c in changes if isinstance(c, RuleLine)))
    # with three rules each dropped on its own, replies keep every subset, not all or nothing
    assert len(kept_sets) >= 5


def test_invent_working_writes_a_wrong_value_with_plausible_working():
    faulty = reader(invent_working=1)
    first = parse_changes(str(faulty.invoke(NOTING).content)).changes
    clean = parse_changes(str(reader(invent_working=0).invoke(NOTING).content)).changes
    changed = [c for c in first if isinstance(c, SetLine) and c not in clean]
    assert changed  # the invented value, and whatever is worked out from it
    item_1_amounts = {"342", "5", "40"}
    # the working starts from the amount the text states and uses another amount of that text
    line = next(c for c in changed if (c.working or "").split()[2] in item_1_amounts)
    stated, sign, step = line.working.split()[:3]
    assert stated in item_1_amounts and step in item_1_amounts - {stated}
    true_values = {c.value for c in clean if isinstance(c, SetLine) and c.key == line.key}
    assert sign in "+-" and line.value not in true_values


def test_a_partial_rate_is_reproducible_by_seed_and_fires_on_some_requests_only():
    requests = [
        [
            *story(f"Item {n}.\nThe clerk recorded domo86 at {n}."),
            questions("What value does domo86 hold now?"),
        ]
        for n in range(1, 41)
    ]

    def empties(seed: int) -> list[bool]:
        model = SimulatedReader(faults=ReaderFaults(empty_reply=0.5, seed=seed))
        return [model.invoke(r).content == "" for r in requests]

    first = empties(3)
    assert first == empties(3)
    assert 5 < sum(first) < 35
    assert first != empties(4)


def test_a_sampled_call_may_decide_differently_but_still_reproducibly():
    requests = [
        [
            *story(f"Item {n}.\nThe clerk recorded domo86 at {n}."),
            questions("What value does domo86 hold now?"),
        ]
        for n in range(1, 41)
    ]
    model = SimulatedReader(faults=ReaderFaults(empty_reply=0.5, seed=3))

    def empties(**kwargs) -> list[bool]:
        return [model.invoke(r, **kwargs).content == "" for r in requests]

    assert empties(temperature=0.8) == empties(temperature=0.8)
    assert empties(temperature=0.8) != empties()
    assert empties(temperature=0) == empties()
