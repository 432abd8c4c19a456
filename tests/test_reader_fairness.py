"""One reader for every arm: summaries get the care notes get, faults reach every kind of call,
and context rot makes a long live window cost something. Behaviour is checked across seeds,
families and sizes, never one stream's exact counts."""

from __future__ import annotations

import itertools
import re
from dataclasses import replace

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from keeper_bench.arms import build_arm
from keeper_bench.grader import SIMULATED_READER, grade
from keeper_bench.reader import SimulatedReader
from keeper_bench.reader.faults import (
    NO_FAULTS,
    REALISTIC_FAULTS,
    ReaderFaults,
    fault_preset,
)
from keeper_bench.reader.rot import (
    NO_ROT,
    REALISTIC_ROT,
    ContextRot,
    rotted_text,
    with_rot,
)
from keeper_bench.reader.summary import write_summary
from keeper_bench.run_options import parse_faults
from keeper_bench.streams import generate_stream, preset_spec, question_sets, read_stream
from keeper_middleware.graphs.baselines import SUMMARY_REQUEST_TAG
from keeper_middleware.messages.facts import text_of
from tests.reader_stories import TALLY, item_1, notes_request, story

TASK = "Read the stories about counters one batch at a time, and answer the questions when asked."
SUMMARY_ASKED = [
    *story(item_1(TALLY), "Item 2.\nTomas Quill added 5 to domo86."),
    HumanMessage(f"{SUMMARY_REQUEST_TAG} Write a summary. Keep it within 900 tokens."),
]
REWRITE = HumanMessage(
    "[NOTES REQUEST] Rewrite the NOTES as one complete block.",
    additional_kwargs={"keeper": "notes_request"},
)


def summary(**rates: float) -> str:
    reader = SimulatedReader(faults=ReaderFaults(seed=3, **rates))
    return str(reader.invoke(SUMMARY_ASKED).content)


# ------------------------------------------------------------------------------------- faults
def test_the_summary_is_written_with_actors_old_values_rules_and_its_budget():
    text = summary()
    assert "House method: the tally of a counter is its value times five plus thirteen." in text
    assert "item 1: The clerk recorded domo86 at 342." in text
    assert "item 2: Tomas Quill added 5 to domo86." in text
    assert (len(text) + 3) // 4 <= 900


def test_every_fault_of_a_notes_reply_reaches_a_summary():
    clean = summary()
    assert "House method" not in summary(drop_rules=1)
    assert summary(invent_working=1) != clean
    misread = summary(sign_flip=1)
    # a set read as its negative, or an amount added read as taken
    assert misread != clean and re.search(r"at -\d+\.|took 5 from domo86", misread)
    reader = SimulatedReader(faults=ReaderFaults(empty_reply=1))
    assert reader.invoke(SUMMARY_ASKED).content == ""
    limited = SimulatedReader(faults=ReaderFaults(think_to_limit=1)).invoke(SUMMARY_ASKED)
    assert limited.response_metadata["finish_reason"] == "length" and limited.content == ""


def test_faults_reach_rewrite_calls_too():
    history = [*story(item_1(TALLY)), REWRITE]
    clean = str(SimulatedReader().invoke(history).content)
    dropped = str(SimulatedReader(faults=ReaderFaults(drop_rules=1)).invoke(history).content)
    invented = str(SimulatedReader(faults=ReaderFaults(invent_working=1)).invoke(history).content)
    assert "House method" in clean and "House method" not in dropped
    assert "(= " in invented and "(= " not in clean


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_one_seeded_mix_fires_at_its_rate_on_summary_and_notes_calls_alike(seed):
    faults = ReaderFaults(drop_rules=0.5, seed=seed)
    reader = SimulatedReader(faults=faults)
    fired = {"summary": 0, "notes": 0}
    for n in range(40):
        batch = f"Item 2.\nTomas Quill added {n + 1} to domo86."
        asked = reader.invoke([*story(item_1(TALLY), batch), SUMMARY_ASKED[-1]])
        fired["summary"] += "House method" not in str(asked.content)
        noted = reader.invoke([*story(item_1(TALLY), batch), notes_request()])
        fired["notes"] += "House method" not in str(noted.content)
    assert 8 <= fired["summary"] <= 32 and 8 <= fired["notes"] <= 32, fired


def test_the_fault_presets_are_named_and_parsed():
    assert fault_preset("none") == NO_FAULTS
    assert fault_preset("realistic", seed=4) == replace(REALISTIC_FAULTS, seed=4)
    assert parse_faults("realistic,seed=4").seed == 4
    assert parse_faults("realistic").sign_flip == REALISTIC_FAULTS.sign_flip > 0
    assert parse_faults("none") == NO_FAULTS
    with pytest.raises(ValueError, match="realistic"):
        fault_preset("harsh")


# ------------------------------------------------------------------------------- context rot
def test_context_rot_settings_are_validated_with_the_fix():
    with pytest.raises(ValueError, match="between 0 and 1"):
        ContextRot(rate=2)
    with pytest.raises(ValueError, match="positive number of tokens"):
        ContextRot(rate=0.1, length=0)
    assert NO_ROT.chance(10**9) == 0 and 0 < REALISTIC_ROT.chance(50_000) < REALISTIC_ROT.rate


def test_rot_spares_the_end_and_overlooks_more_as_distance_and_rate_grow():
    text = " ".join(f"Mira Holt added {n} to domo{n % 90 + 10:02d}." for n in range(1, 400))
    rot = ContextRot(rate=0.8, length=1_000)
    near = rotted_text(text, "input", 0, rot)
    far = rotted_text(text, "input", 5_000, rot)
    assert near.endswith(text[-60:])  # the last sentences are read
    assert len(far) < len(near) < len(text)
    kept_by_rate = [
        set(
            re.findall(
                r"added \d+ to domo\d+",
                rotted_text(text, "input", 500, ContextRot(rate=r, length=1_000)),
            )
        )
        for r in (0.0, 0.2, 0.5, 1.0)
    ]
    assert all(a >= b for a, b in itertools.pairwise(kept_by_rate))
    assert kept_by_rate[0] > kept_by_rate[-1]


def test_rot_leaves_heads_questions_and_the_keepers_requests_alone():
    messages: list[BaseMessage] = [
        *story(*(f"Item {n}.\nMira Holt added {n} to domo86." for n in range(1, 30))),
        notes_request(),
    ]
    seen = with_rot(messages, ContextRot(rate=1.0, length=1))
    texts = [text_of(m) for m in seen]
    assert all(re.match(r"Item \d+\.", t) for t in texts[:-1] if t.startswith("Item"))
    assert texts[-1] == text_of(messages[-1])
    assert sum("added" in t for t in texts) < sum("added" in text_of(m) for m in messages)
    assert all(  # the input was not changed
        "added" in text_of(m) for m in messages if text_of(m).startswith("Item")
    )


def _all_in_view_score(folder, rot: ContextRot) -> int:
    """Every batch in view (a long live window): how many questions the reader gets right."""
    reader = SimulatedReader(rot=rot)
    history: list[BaseMessage] = [HumanMessage(TASK)]
    replies: dict[tuple[int, bool], str] = {}
    for record in read_stream(folder):
        if record["type"] == "batch":
            history += [HumanMessage(record["text"]), AIMessage(f"Read item {record['item']}.")]
        else:
            reply = reader.invoke([*history, HumanMessage(record["text"])])
            replies[(record["after_item"], record["final"])] = str(reply.content)
    return grade(question_sets(folder), replies, reader=SIMULATED_READER, label="all").right


@pytest.mark.parametrize("size", ["tiny", pytest.param("small", marks=pytest.mark.slow)])
@pytest.mark.parametrize("families", ["rules", "overdrawn+varied"])
@pytest.mark.parametrize("seed", [1, 2, 5])
def test_context_rot_lowers_a_long_window_monotonically_in_its_rate(tmp_path, seed, families, size):
    chosen = frozenset({"base", *families.split("+")})
    generate_stream(preset_spec(size, seed=seed, families=chosen), tmp_path)
    length = 2_000 if size == "tiny" else 10_000
    scores = [
        _all_in_view_score(tmp_path, ContextRot(rate=rate, length=length, seed=seed))
        for rate in (0.0, 0.4, 1.0)
    ]
    assert scores == sorted(scores, reverse=True) and scores[-1] < scores[0], scores


# ------------------------------------------------------------------- summaries across streams
@pytest.mark.parametrize(
    ("size", "window"),
    [("tiny", 4096), pytest.param("small", 32_768, marks=pytest.mark.slow)],
    ids=["tiny", "small"],
)
@pytest.mark.parametrize("families", ["rules+overdrawn", "harder+varied"])
@pytest.mark.parametrize("seed", [1, 2, 5])
def test_a_summary_within_its_budget_keeps_actors_and_old_values(
    tmp_path, seed, families, size, window
):
    """When the history fits the budget, the summarize arm answers who-did-it and old-value
    questions as well as current ones: nothing is lost by the summariser."""
    chosen = frozenset({"base", *families.split("+")})
    generate_stream(preset_spec(size, seed=seed, families=chosen), tmp_path)
    budget = window // 2
    reader = SimulatedReader(summary_tokens=budget)
    arm = build_arm("summarize", reader, window=window, summary_tokens=budget)
    thread = {"configurable": {"thread_id": "fair"}}
    arm.graph.invoke({"messages": [HumanMessage(TASK)]}, thread)
    replies: dict[tuple[int, bool], str] = {}
    summaries = 0
    for record in read_stream(tmp_path):
        out = arm.graph.invoke({"messages": [HumanMessage(record["text"])]}, thread)
        summaries += any(text_of(m).startswith("[SUMMARY]") for m in out["messages"])
        if record["type"] == "questions":
            replies[(record["after_item"], record["final"])] = text_of(out["messages"][-1])
    arm.close()
    result = grade(question_sets(tmp_path), replies, reader=SIMULATED_READER, label="summarize")
    assert summaries > 0
    for category in ("who", "old", "current"):
        got, asked = result.by_category.get(category, (0, 0))
        assert got == asked, (category, result.markdown())


def test_a_summary_over_budget_drops_old_history_before_values():
    batches = [f"Item {n}.\nMira Holt recorded domo{n:02d} at {n}." for n in range(10, 60)]
    start = [*story(item_1(TALLY), *batches), SUMMARY_ASKED[-1]]
    roomy = write_summary([*start[:-1], HumanMessage(SUMMARY_REQUEST_TAG)], budget=5_000)
    tight = write_summary([*start[:-1], HumanMessage(SUMMARY_REQUEST_TAG)], budget=400)
    oldest = "item 10: Mira Holt recorded domo10 at 10."
    assert oldest in roomy and oldest not in tight
    assert "House method" in tight and "stood at" in tight
    assert (len(tight) + 3) // 4 <= 400
