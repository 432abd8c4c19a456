"""Misreads of every kind, each a fault of its own: each changes what the reader takes from the
text the way it says, and it does so in every kind of call (an answer, a notes reply, a summary,
a memory edit), so every arm meets the same misread."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from keeper_bench.reader import SimulatedReader
from keeper_bench.reader.faults import MISREAD_KINDS, ReaderFaults
from keeper_bench.reader.misreads import Misreads, misread, misreads_for
from keeper_bench.reader.text import Event
from keeper_bench.run_options import RunOptions, resolve_stream
from keeper_bench.runner import run_arm
from keeper_middleware.notes.changes import SetLine, parse_changes
from tests.reader_stories import ITEM_2, answers, item_1, notes_request, questions, story

BATCH = [
    Event("set", "domo86", 342, None, "the clerk"),
    Event("add", "kibu12", 5, None, "Mira Holt"),
    Event("take", "domo86", 10, None, "Tomas Quill"),
]


def strike(kind: str, where: float = 0.0, which: float = 0.0) -> list[Event]:
    return misread([BATCH], Misreads(((kind, where, which),)))[0]


def test_each_kind_changes_one_statement_the_way_it_says():
    assert strike("sign_flip")[0].amount == -342
    assert strike("sign_flip", 0.5)[1].kind == "take"  # an amount added is read as taken
    assert strike("other_amount")[0].amount in {5, 10}  # another amount of the same text
    assert strike("overlooked", 0.5) == [BATCH[0], BATCH[2]]
    assert strike("wrong_actor")[0].actor in {"Mira Holt", "Tomas Quill"}
    stale = strike("stale_value", 0.9)  # the last change to a counter: seen, not applied
    assert stale[2].applied is False and stale[2].amount == 10 and stale[:2] == BATCH[:2]
    invented = strike("invent_working")[0]
    assert invented.working is not None and invented.amount != 342
    stated, sign, step = invented.working.split()
    assert stated == "342" and int(step) in {5, 10}
    assert invented.amount == 342 + (int(step) if sign == "+" else -int(step))


def test_a_memory_line_can_be_misread_only_as_a_value_can():
    memory = [Event("set", "domo86", 342, None, "")]
    for kind in ("wrong_actor", "stale_value", "invent_working"):
        assert misread([memory], Misreads(((kind, 0.0, 0.0),)), memory=frozenset({0})) == [memory]
    flipped = misread([memory], Misreads((("sign_flip", 0.0, 0.0),)), memory=frozenset({0}))
    assert flipped[0][0].amount == -342


LONG_BATCH = [
    Event("add", f"kelo{n:02d}", 3 + n % 7, None, ("Mira Holt", "Tomas Quill")[n % 2])
    for n in range(50)
]


def test_each_kind_strikes_each_statement_read_at_its_own_rate():
    # the rate is the share of statements read wrong, not of calls: 50 statements in each of
    # 40 calls at 10% is about 200 misread, each call on its own draws
    for kind in MISREAD_KINDS:
        if kind == "invent_working":  # strikes stated values only: a batch of sets
            batch = [Event("set", e.name, e.amount, None, e.actor) for e in LONG_BATCH]
        else:
            batch = LONG_BATCH
        faults = ReaderFaults(seed=5, **{kind: 0.1})
        struck = 0
        for n in range(40):
            read = misread([batch], misreads_for(faults, f"request-{n}"))[0]
            if kind == "overlooked":
                struck += len(batch) - len(read)
            elif kind == "stale_value":
                struck += sum(not e.applied for e in read)
            else:
                struck += sum(a != b for a, b in zip(read, batch, strict=True))
        candidates = 40 * (len({e.name for e in batch}) if kind == "stale_value" else len(batch))
        assert 0.06 * candidates <= struck <= 0.14 * candidates, (kind, struck, candidates)
        others = ReaderFaults(seed=5, **{k: 0.1 for k in MISREAD_KINDS if k != kind})
        assert kind not in misreads_for(others, "request-0").rated_kinds


def test_no_rate_no_misread():
    assert not misreads_for(ReaderFaults(seed=5, empty_reply=1.0), "request-0")
    assert misread([BATCH], misreads_for(ReaderFaults(), "request-0")) == [BATCH]


# -- the same misread in every kind of call ----------------------------------------------------
CONTEXT = story(item_1(), ITEM_2)
# True after item 2: domo86 = 342 - 10 + (5 - 9) = 328; kibu12 = -4; kelo12 = 40.


def reader(**rates: float) -> SimulatedReader:
    return SimulatedReader(faults=ReaderFaults(seed=11, **rates))


def noted(**rates: float) -> dict[str, str]:
    reply = reader(**rates).invoke([*CONTEXT, notes_request()])
    return {
        c.key: c.value for c in parse_changes(str(reply.content)).changes if isinstance(c, SetLine)
    }


def summarised(**rates: float) -> str:
    from langchain_core.messages import HumanMessage

    asked = HumanMessage("[SUMMARY REQUEST] Write a summary. Keep it within 900 tokens.")
    return str(reader(**rates).invoke([*CONTEXT, asked]).content)


def answered(*asked: str, **rates: float) -> dict[int, str]:
    return answers(reader(**rates).invoke([*CONTEXT, questions(*asked)]))


def test_a_stale_value_is_kept_in_notes_summaries_and_answers_alike():
    # the last change each read strikes is kelo12's set, kibu12's take or domo86's held add
    assert noted() == {"domo86": "328", "kibu12": "-4", "kelo12": "40"}
    stale = noted(stale_value=1)
    assert stale != noted() and len([k for k in stale if stale[k] != noted()[k]]) >= 1
    clean_summary, stale_summary = summarised(), summarised(stale_value=1)
    assert stale_summary != clean_summary
    # the history still lists every change; a value line is what it was before
    assert stale_summary.count("item 2:") >= clean_summary.count("item 2:") - 1
    now = (
        "What value does domo86 hold now?",
        "What value does kibu12 hold now?",
        "What value does kelo12 hold now?",
    )
    assert answered(*now) == {1: "328", 2: "-4", 3: "40"}
    assert answered(*now, stale_value=1) != {1: "328", 2: "-4", 3: "40"}


def test_the_wrong_actor_changes_who_answers_and_summaries_never_values():
    asked = ("Who changed domo86 in item 2?", "What value does domo86 hold now?")
    assert answered(*asked) == {1: "Tomas Quill", 2: "328"}
    wrong = answered(*asked, wrong_actor=1)
    assert wrong[2] == "328"
    assert noted(wrong_actor=1) == noted()  # the notes keep values, not actors
    assert summarised(wrong_actor=1) != summarised()


def test_a_change_overlooked_is_missing_from_notes_summaries_and_answers():
    clean = noted()
    missed = noted(overlooked=1)
    assert missed != clean

    def history(text: str) -> list[str]:
        return [
            line for line in text.splitlines() if line.startswith("item ") and "stood" not in line
        ]

    # at rate 1 every change read is overlooked: none reaches the summary's history
    assert history(summarised()) and not history(summarised(overlooked=1))


# -- a run: each kind changes the answers it says it changes, in every arm ---------------------
VALUE_CATEGORIES = ("current", "old", "before_last", "method", "overdrawn", "rule")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return resolve_stream("tiny:rules+overdrawn", tmp_path_factory.mktemp("stream"))


def _grades(stream: Path, folder: Path, arm: str, faults: str) -> dict[str, list[int]]:
    options = RunOptions.create(arm=arm, stream=stream, window=4096, faults=faults)
    run_arm(options, folder, progress=False)
    return json.loads((folder / "grade.json").read_text())["by_category"]


def test_a_wrong_actor_costs_who_answers_only_and_a_stale_value_values_only(tiny, tmp_path):
    lost_to_stale = 0
    for arm in ("window_drop", "summarize", "notes"):
        clean = _grades(tiny, tmp_path / arm / "clean", arm, "")
        actor = _grades(tiny, tmp_path / arm / "actor", arm, "wrong_actor=1,seed=2")
        stale = _grades(tiny, tmp_path / arm / "stale", arm, "stale_value=1,seed=2")
        for category in VALUE_CATEGORIES:
            assert actor.get(category) == clean.get(category), (arm, category)  # values right
        # the actors are read right (a summary that lost a value may keep more history in
        # its room, so "who" can only stay or rise)
        assert stale["who"][0] >= clean["who"][0], arm
        values = [c for c in clean if c in VALUE_CATEGORIES]
        lost = sum(clean[c][0] for c in values) - sum(stale[c][0] for c in values)
        assert lost >= 0, arm
        lost_to_stale += lost
    assert lost_to_stale > 0
