"""Every arm runs a benchmark stream end to end with the simulated reader and keeps (or loses)
what its way of managing context says it does."""

from __future__ import annotations

import re

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from pydantic import Field

from keeper_bench.arms import ARMS, Arm, build_arm
from keeper_bench.grader import SIMULATED_READER, GradeResult, grade
from keeper_bench.phrasing import render_questions_message
from keeper_bench.reader import SimulatedReader
from keeper_bench.reader.summary import is_summary_request, write_summary
from keeper_bench.streams import (
    generate_stream,
    preset_spec,
    question_sets,
    read_stream,
)
from keeper_middleware.errors import WindowTooSmallError
from keeper_middleware.graphs.baselines import SUMMARY_REQUEST_TAG, compact, drop_oldest
from keeper_middleware.messages.facts import keeper_kind, text_of
from keeper_middleware.retrievers.embedders import HashingEmbedder
from keeper_middleware.retrievers.factory import make_retriever
from keeper_middleware.state_view import model_view

WINDOW = 4096
"""The tiny stream is ~5K real tokens, ~6.5K as the default (conservative) counter counts it:
more than a window and a quarter. At 2,048 the fixed part (tools, NOTES, note request, a
question's searches and retrieved passages) left no room for a question's work by that count;
at 4,096 the NOTES budget (256 tokens) moves most STATE entries to the archive, and the searches
that read them back outgrow what is left, so a question's own work is cut away mid-answer."""
TASK = "Read the stories about counters one batch at a time, and answer the questions when asked."
THREAD = {"configurable": {"thread_id": "arm-test"}}
OVERDRAWN_RULE = "Standing rule: any figure below zero, whether recorded or worked out"


class RecordingReader(SimulatedReader):
    """The simulated reader, recording every request and every bind_tools call."""

    sent: list[tuple[list[BaseMessage], dict]] = Field(default_factory=list)
    bound: list[list[str]] = Field(default_factory=list)

    def bind_tools(self, tools, *, tool_choice=None, **kwargs):  # type: ignore[no-untyped-def]
        clone = super().bind_tools(tools, tool_choice=tool_choice, **kwargs)
        self.bound.append([getattr(t, "name", str(t)) for t in tools])
        return clone

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):  # type: ignore[no-untyped-def]
        self.sent.append((list(messages), dict(kwargs)))
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stream")
    generate_stream(preset_spec("tiny", seed=0, families=frozenset({"rules", "overdrawn"})), folder)
    return folder


def drive(arm: Arm, folder) -> tuple[GradeResult, dict[int, list[BaseMessage]]]:
    """Task, then every batch and question set as a user message; the views at each set."""
    arm.graph.invoke({"messages": [HumanMessage(TASK)]}, THREAD)
    replies: dict[tuple[int, bool], str] = {}
    views: dict[int, list[BaseMessage]] = {}
    for record in read_stream(folder):
        out = arm.graph.invoke({"messages": [HumanMessage(record["text"])]}, THREAD)
        if record["type"] == "questions":
            last = [m for m in out["messages"] if isinstance(m, AIMessage)][-1]
            replies[(record["after_item"], record["final"])] = text_of(last)
            # what the model was sent: the keeper's passages live in its channel, not the state
            views[record["after_item"]] = model_view(out["messages"], out.get("keeper"))
    return grade(question_sets(folder), replies, reader=SIMULATED_READER, label=arm.name), views


def run(
    name: str, folder, window: int = WINDOW, reader: SimulatedReader | None = None, **options
) -> tuple[GradeResult, dict[int, list[BaseMessage]], Arm]:
    model = reader or SimulatedReader()
    arm = build_arm(name, model, window=window, domain="counters", **options)
    result, views = drive(arm, folder)
    arm.close()
    return result, views, arm


def right(result: GradeResult, category: str) -> tuple[int, int]:
    return result.by_category.get(category, (0, 0))


# ---------------------------------------------------------------------------------- scores


@pytest.mark.parametrize("name", ["notes", "notes_retrieval", "notes_rewrite"])
def test_the_keeper_arms_answer_every_answerable_question(stream, name):
    result, _, arm = run(name, stream)
    assert result.right == result.asked, result.markdown()
    assert arm.keeper is not None and arm.keeper.counters("arm-test").cuts >= 2


def test_window_drop_answers_nothing_from_beyond_its_window(stream):
    result, _, _ = run("window_drop", stream)
    far_right, far_asked = result.by_bucket["25–99"]
    assert far_asked >= 3 and far_right == 0, result.markdown()
    # the standing rule left the window with item 1: later rule questions get a plain value
    assert right(result, "rule")[0] < right(result, "rule")[1] / 2


def test_compaction_is_window_drop_when_no_tool_output_is_in_view(stream):
    dropped, _, _ = run("window_drop", stream)
    compacted, _, _ = run("compaction", stream)
    assert [q.given for q in compacted.scored] == [q.given for q in dropped.scored]


def filler_item(number: int) -> str:
    return f"Item {number}.\n" + " ".join(
        f"The {w} drifted past the mill at dawn." for w in ("goat", "cart", "boat", "kite") * 6
    )


RULE_ITEM = (
    "Item 1.\nThe rain kept on. The market was quiet. "
    "Standing rule: any figure below zero, whether recorded or worked out, is reported as the "
    "single word overdrawn. The wind rose over the hills. "
    "Mira Holt recorded domo86 at 5."
)


@pytest.mark.parametrize(("name", "answer"), [("rag", "-4"), ("notes", "overdrawn")])
def test_a_rule_that_names_nothing_is_lost_to_retrieval_once_it_leaves_the_window(name, answer):
    """Measured: retrieval alone applied such a rule 0 times in 16, the keeper 16 in 16. Nothing
    in "What value does domo86 hold now?" leads a search back to the rule or its neighbours."""
    arm = build_arm(name, SimulatedReader(), window=WINDOW, retrieved_per_question=3)
    inputs = [TASK, RULE_ITEM, "Item 2.\nTomas Quill took 9 from domo86."]
    inputs += [filler_item(n) for n in range(3, 16)]
    inputs.append(render_questions_message([(1, "What value does domo86 hold now?")]))
    for text in inputs:
        out = arm.graph.invoke({"messages": [HumanMessage(text)]}, THREAD)
    assert not any(text_of(m).startswith("Item 1.") for m in out["messages"])
    assert text_of(out["messages"][-1]) == f"1. {answer}"
    arm.close()


def test_on_the_benchmark_stream_rag_never_retrieves_the_rule_that_names_nothing(stream):
    """The rule shares no word with any question and stands between filler sentences, so the
    passages retrieval shows never carry it: once the rule has left the window, rag answers the
    questions it governs with the plain figure (the lab: 0 of 16)."""
    result, views, _ = run("rag", stream, retrieved_per_question=3)
    for view in views.values():
        retrieved = [text_of(m) for m in view if keeper_kind(m) == "retrieved"][-1]
        assert OVERDRAWN_RULE not in retrieved
    out_of_view = {
        after
        for after, view in views.items()
        if not any(OVERDRAWN_RULE in text_of(m) for m in view)
    }
    governed = [
        q for q in result.scored if q.category == "overdrawn" and q.after_item in out_of_view
    ]
    assert governed and not any(q.right for q in governed), result.markdown()


@pytest.mark.parametrize(
    "name", ["summarize", "peer_langchain_summarization", "peer_langmem_summarization"]
)
def test_summaries_within_their_budget_keep_rules_values_actors_and_old_values(stream, name):
    """When the whole history fits a summary's budget, a fair summariser keeps what it was asked
    to keep, so the summary arms answer every kind of question (what they lose at scale comes
    from the budget and from summarising summaries, not from the summariser)."""
    budget = {"summary_tokens": 2048} if name == "summarize" else {}
    reader = RecordingReader(summary_tokens=2048)
    result, _, _ = run(name, stream, window=4096, reader=reader, **budget)
    assert any(is_summary_request(sent) for sent, _ in reader.sent)
    for category in ("rule", "overdrawn", "current", "old", "who", "method"):
        got, asked = right(result, category)
        assert got == asked, (category, result.markdown())


def test_a_summary_over_its_budget_loses_the_oldest_history_first(stream):
    """At a small window the summary's budget (an eighth of it) cannot hold every change: who
    changed what long ago goes first; the rules stay, and most current values."""
    result, _, _ = run("summarize", stream)
    assert right(result, "rule") == (8, 8)
    who_right, who_asked = right(result, "who")
    current_right, current_asked = right(result, "current")
    assert who_right < who_asked and who_right / who_asked < current_right / current_asked, (
        result.markdown()
    )


# ---------------------------------------------------------------------------------- contracts


def test_rag_never_offers_the_store_to_the_model(stream):
    model = RecordingReader()
    arm = build_arm("rag", model, window=WINDOW, retrieved_per_question=3)
    drive(arm, stream)
    assert model.bound == []
    assert model.sent and all("tools" not in kwargs for _, kwargs in model.sent)
    assert not any(isinstance(m, ToolMessage) for sent, _ in model.sent for m in sent)
    assert any(keeper_kind(m) == "retrieved" for sent, _ in model.sent for m in sent)


def test_swapping_the_retriever_of_notes_retrieval_changes_only_the_retrieved_passages(stream):
    keyword_arm = build_arm(
        "notes_retrieval", SimulatedReader(), window=4096, domain="counters", retriever="keyword"
    )
    keyword, keyword_views = drive(keyword_arm, stream)
    hybrid_store = make_retriever("hybrid", embedder=HashingEmbedder())
    hybrid_arm = build_arm(
        "notes_retrieval", SimulatedReader(), window=4096, domain="counters", retriever=hybrid_store
    )
    hybrid, hybrid_views = drive(hybrid_arm, stream)
    assert [q.given for q in keyword.scored] == [q.given for q in hybrid.scored]

    def notes(arm: Arm) -> list[str]:
        assert arm.keeper is not None
        return [v.text for v in arm.keeper.archive.notes_versions("arm-test")]

    def retrieved(view: list[BaseMessage]) -> list[str]:
        return [text_of(m) for m in view if keeper_kind(m) == "retrieved"]

    # the shown passages differ, and with them the size of the window (so where cuts fall);
    # the answers, the rules and the state the notes reach do not
    assert (
        notes(keyword_arm)[-1].split("STATE")[0].split("RULES")[1]
        == notes(hybrid_arm)[-1].split("STATE")[0].split("RULES")[1]
    )
    assert any(retrieved(keyword_views[k]) != retrieved(hybrid_views[k]) for k in keyword_views)
    keyword_arm.close()
    hybrid_arm.close()


def test_the_summary_request_is_sent_like_a_normal_call_and_its_summary_replaces_the_turns(stream):
    model = RecordingReader()
    arm = build_arm("summarize", model, window=WINDOW, system_prompt="You read stories.")
    drive(arm, stream)
    requests = [sent for sent, _ in model.sent if text_of(sent[-1]).startswith(SUMMARY_REQUEST_TAG)]
    assert len(requests) >= 2
    assert all(text_of(sent[0]) == "You read stories." for sent in requests)
    final = arm.graph.get_state(THREAD).values["messages"]
    summaries = [m for m in final if keeper_kind(m) == "summary"]
    assert len(summaries) == 1 and final[1] is not None and keeper_kind(final[1]) == "summary"
    assert text_of(final[0]) == TASK
    body = text_of(summaries[0]).split("\n", 1)[1]
    assert (len(body) + 3) // 4 <= WINDOW // 8  # the budget it was given: an eighth of the window
    assert all(f"Keep it within {WINDOW // 8} tokens." in text_of(sent[-1]) for sent in requests)


def test_unknown_arms_and_options_are_refused_with_the_choices():
    with pytest.raises(ValueError, match="window_drop"):
        build_arm("trimming", SimulatedReader(), window=WINDOW)
    with pytest.raises(TypeError, match="keep_turns"):
        build_arm("window_drop", SimulatedReader(), window=WINDOW, keep_turns=3)
    assert set(ARMS) >= {"rag", "notes", "peer_langmem_summarization"}
    assert {n for n, info in ARMS.items() if info.uses_retriever} == {
        "rag",
        "notes",
        "notes_retrieval",
        "notes_rewrite",
        "self_edit_archive",
        "self_edit_rules",
        "free_notes",
    }


# ---------------------------------------------------------------------------------- pure parts


def tool_loop(index: int) -> list[BaseMessage]:
    call = {"name": "read_next_batch", "args": {}, "id": f"c{index}", "type": "tool_call"}
    return [
        HumanMessage(f"Go on {index}.", id=f"h{index}"),
        AIMessage("", tool_calls=[call], id=f"a{index}"),
        ToolMessage(f"Item {index}. " + "words " * 40, tool_call_id=f"c{index}", id=f"t{index}"),
        AIMessage(f"Read item {index}.", id=f"r{index}"),
    ]


def test_window_drop_removes_whole_turns_and_never_splits_a_call_from_its_result():
    messages = [HumanMessage("The task.", id="task")]
    for index in range(1, 6):
        messages += tool_loop(index)

    def fits(kept):
        return sum(len(text_of(m)) for m in kept) < 700

    kept = drop_oldest(messages, 1, fits)
    assert kept[0].id == "task" and kept[1].id.startswith("h")
    calls = {c["id"] for m in kept if isinstance(m, AIMessage) for c in m.tool_calls}
    assert {m.tool_call_id for m in kept if isinstance(m, ToolMessage)} == calls
    with pytest.raises(WindowTooSmallError):
        drop_oldest(messages, 1, lambda kept: False)


def test_compaction_stubs_old_tool_output_and_keeps_the_newest():
    messages = [HumanMessage("The task.", id="task")]
    for index in range(1, 6):
        messages += tool_loop(index)
    compacted = compact(messages, 1, keep_tool_results=2)
    results = [text_of(m) for m in compacted if isinstance(m, ToolMessage)]
    assert results[:3] == ["[cleared: old tool output]"] * 3
    assert results[3].startswith("Item 4.") and results[4].startswith("Item 5.")
    assert [m.id for m in compacted] == [m.id for m in messages]
    assert text_of(messages[3]).startswith("Item 1.")  # the input list is not changed


def test_the_reader_answers_summary_requests_with_rules_values_actors_and_old_values():
    story = HumanMessage(
        "Item 1.\nHouse method: the tally of a counter is its value times five plus thirteen. "
        "Mira Holt recorded domo86 at 40. Tomas Quill took 9 from domo86."
    )
    for request in (
        f"{SUMMARY_REQUEST_TAG} Write a summary.",
        "Create a summary of the conversation above:",
        "This is summary of the conversation so far: x\n\nExtend this summary by taking into "
        "account the new messages above:",
    ):
        messages = [story, AIMessage("Read item 1."), HumanMessage(request)]
        assert is_summary_request(messages)
        summary = write_summary(messages, budget=500)
        assert "House method: the tally of a counter" in summary
        assert "item 1: Mira Holt recorded domo86 at 40." in summary
        assert "item 1: Tomas Quill took 9 from domo86." in summary
        assert "item 1: domo86 stood at 31." in summary
    assert not is_summary_request([story])
    assert not is_summary_request([HumanMessage("Here is a summary of the conversation to date:")])


@pytest.mark.parametrize("name", ["rag", "notes_retrieval"])
def test_the_retrieving_arms_run_with_a_hybrid_retriever(stream, name):
    store = make_retriever("hybrid", embedder=HashingEmbedder())
    arm = build_arm(name, SimulatedReader(), window=8192, retriever=store, domain="counters")
    arm.graph.invoke({"messages": [HumanMessage(TASK)]}, THREAD)
    for record in list(read_stream(stream))[:6]:  # through the first question set
        out = arm.graph.invoke({"messages": [HumanMessage(record["text"])]}, THREAD)
    assert arm.retriever is store
    view = model_view(out["messages"], out.get("keeper"))
    assert any(keeper_kind(m) == "retrieved" for m in view)
    assert re.search(r"^1\. ", text_of(out["messages"][-1]), re.M)
    arm.close()
