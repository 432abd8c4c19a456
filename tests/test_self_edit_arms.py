"""The self-editing arms: a pinned state the model edits with tools, with or without an archive.

Pinned here: an edit that would remove or reword a RULE: line is rejected and leaves the state
as it was; every batch that leaves the window reaches the archive exactly once; the free-text
arm keeps the model's prose word for word; and, with the simulated reader, what each method
keeps across seeds and sizes (a rule only where the state has a place for one, actors only
where an archive holds the text).
"""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from keeper_bench.arms import build_arm
from keeper_bench.arms.self_edit import PINNED_TAG, PinnedState, apply_edit
from keeper_bench.arms.self_edit.memory import INSTRUCTIONS
from keeper_bench.grader import SIMULATED_READER, grade
from keeper_bench.reader import ReaderFaults, SimulatedReader
from keeper_bench.reader.pinned import RULES_READ_SENTENCE, read_pinned
from keeper_bench.runner import STREAM_PASSAGES
from keeper_bench.streams import (
    StreamSpec,
    generate_stream,
    preset_spec,
    question_sets,
    read_stream,
)
from keeper_middleware.messages.facts import keeper_kind, text_of
from tests.fake_model import ScriptedChatModel

SELF_EDIT_ARMS = ("self_edit", "self_edit_archive", "self_edit_rules", "free_notes")
ARCHIVE_ARMS = ("self_edit_archive", "self_edit_rules", "free_notes")
TASK = "Read the stories about counters one batch at a time, and answer the questions when asked."
RULE = (
    "Standing rule: the counters domo86, katu85 and sefi12 are confidential; whenever asked for "
    "the value of one of them, answer with the single word protected."
)


def count(text: str) -> int:
    return (len(text) + 3) // 4


def thread(name: str) -> dict:
    # a reply's tool calls in their order, as the benchmark runs them: in parallel threads, which
    # of two searches the guard saw "just before" was a race, and a who-question now and then lost
    return {"configurable": {"thread_id": name}, "max_concurrency": 1}


def pinned_of(messages: list[BaseMessage]) -> str:
    return next(text_of(m) for m in messages if keeper_kind(m) == "pinned")


def call(name: str, args: dict, index: int) -> dict:
    return {"name": name, "args": args, "id": f"call-{name}-{index}", "type": "tool_call"}


# ------------------------------------------------------------------------------ the pure state


@pytest.mark.parametrize("budget", [64, 256, 4096])
def test_an_edit_that_removes_or_rewords_a_rule_line_is_rejected_and_changes_nothing(budget):
    state, added = PinnedState(style="rules"), []
    for tool, args in (
        ("memory_rule", {"rule": RULE}),
        ("memory_set", {"name": "x1", "value": "4"}),
    ):
        result = apply_edit(state, tool, args, budget=budget, count=count)
        added.append(result.accepted)
        state = result.state
    assert added == [True, True]
    for tool, args in (
        ("memory_delete", {"name": "RULE"}),
        ("memory_delete", {"name": "domo86"}),  # a name inside a rule: removing it would reword
        ("memory_set", {"name": "RULE:", "value": "the counters are public"}),
        ("memory_set", {"name": "rule", "value": RULE.replace("protected", "secret")}),
    ):
        result = apply_edit(state, tool, args, budget=budget, count=count)
        assert not result.accepted and result.reply.startswith("Refused: RULE: lines are permanent")
        assert result.state == state
    again = apply_edit(state, "memory_rule", {"rule": f"RULE: {RULE}"}, budget=budget, count=count)
    assert again.state.rules == (RULE,) and again.reply == "Already kept."


def test_line_edits_replace_in_place_and_keep_the_least_recently_set_first():
    state = PinnedState(style="lines")
    for name, value in (("a1", "1"), ("b2", "2"), ("a1", "3"), ("c3", "4")):
        state = apply_edit(
            state, "memory_set", {"name": name, "value": value}, budget=500, count=count
        ).state
    assert state.lines == (("b2", "2"), ("a1", "3"), ("c3", "4"))
    state = apply_edit(state, "memory_delete", {"name": "b2"}, budget=500, count=count).state
    assert state.body() == "a1 3\nc3 4"
    # the line arms have no rule lines: a rule tool is not theirs
    refused = apply_edit(state, "memory_rule", {"rule": RULE}, budget=500, count=count)
    assert not refused.accepted and "not one of your memory tools" in refused.reply


@pytest.mark.parametrize("budget", [8, 40, 120])
def test_an_edit_over_the_size_limit_is_refused_and_a_deletion_makes_room(budget):
    state = PinnedState(style="lines")
    accepted = 0
    for number in range(200):
        result = apply_edit(
            state,
            "memory_set",
            {"name": f"n{number:02d}", "value": "123"},
            budget=budget,
            count=count,
        )
        if not result.accepted:
            assert "over its" in result.reply and "memory_delete" in result.reply
            break
        state, accepted = result.state, accepted + 1
    assert count(state.body()) <= budget and 0 < accepted < 200
    freed = apply_edit(state, "memory_delete", {"name": "n00"}, budget=budget, count=count).state
    assert apply_edit(
        freed, "memory_set", {"name": "late", "value": "1"}, budget=budget, count=count
    ).accepted


@pytest.mark.parametrize(
    "args",
    [
        None,
        {"name": 5, "value": "1"},
        {"name": "a b", "value": "1"},
        {"name": "", "value": "1"},
        {"name": "x", "value": "y" * 5000},
        {"name": "x", "value": "\ud800"},
    ],
)
def test_whatever_a_model_sends_comes_back_as_a_refusal_that_loses_nothing(args):
    state = PinnedState(style="lines", lines=(("keep1", "7"),))
    result = apply_edit(state, "memory_set", args, budget=500, count=count)
    assert not result.accepted and result.reply.startswith("Refused:")
    assert result.state == state


def test_prose_is_edited_by_passage_and_nothing_in_it_is_protected():
    state = PinnedState(style="prose")
    state = apply_edit(
        state, "notes_append", {"text": f"{RULE}\ndomo86 stood at 5."}, budget=500, count=count
    ).state
    assert state.prose == (RULE, "domo86 stood at 5.")
    missing = apply_edit(
        state, "notes_replace", {"old": "nowhere77 stood", "new": "x"}, budget=500, count=count
    )
    assert not missing.accepted and "copy it exactly" in missing.reply
    gone = apply_edit(state, "notes_replace", {"old": RULE, "new": ""}, budget=500, count=count)
    assert gone.accepted and gone.state.prose == ("domo86 stood at 5.",)


def test_the_reader_and_the_arm_agree_on_the_pinned_format():
    state = PinnedState(style="rules", rules=(RULE,), lines=(("domo86", "5"),), through_item=7)
    from keeper_bench.arms.self_edit import render_pinned

    text = render_pinned(state, archive=True, budget=900, count=count)
    view = read_pinned(text)
    assert text.startswith(PINNED_TAG) and view.reads_rules
    assert (view.through_item, view.budget, view.rules, view.values()) == (
        7,
        900,
        (RULE,),
        {"domo86": 5},
    )
    assert RULES_READ_SENTENCE in INSTRUCTIONS[("rules", True)]
    assert all(
        RULES_READ_SENTENCE not in text
        for (style, _), text in INSTRUCTIONS.items()
        if style != "rules"
    )


# ------------------------------------------------------------------------------ the graphs


def batch(item: int, words: int = 60) -> str:
    return (
        f"Item {item}.\nMira Holt recorded domo{item:02d} at {item * 3}. "
        + "The mill was quiet. " * words
    )


def scripted_writer(style: str) -> ScriptedChatModel:
    """A model that writes one memory edit for each batch it is shown, then moves on."""

    def reply(messages: list[BaseMessage]) -> AIMessage:
        last = messages[-1]
        if isinstance(last, ToolMessage):
            return AIMessage("Noted.")
        text = text_of(last)
        if not text.startswith("Item "):
            return AIMessage("OK.")
        item = int(text.split(".", 1)[0].split()[1])
        if style == "prose":
            edit = call(
                "notes_append", {"text": f"In item {item} Mira Holt set domo{item:02d}."}, item
            )
        else:
            edit = call("memory_set", {"name": f"domo{item:02d}", "value": str(item * 3)}, item)
        return AIMessage("", tool_calls=[edit])

    return ScriptedChatModel(default=reply)


STYLE_OF = {
    "self_edit": "lines",
    "self_edit_archive": "lines",
    "self_edit_rules": "rules",
    "free_notes": "prose",
}


@pytest.mark.parametrize("name", ARCHIVE_ARMS)
@pytest.mark.parametrize(
    ("batches", "words", "window"), [(6, 20, 2048), (14, 60, 4096), (9, 150, 8192)]
)
def test_every_batch_that_leaves_the_window_reaches_the_archive_exactly_once(
    name, batches, words, window
):
    arm = build_arm(name, scripted_writer(STYLE_OF[name]), window=window)
    config = thread(f"{name}-{batches}")
    arm.graph.invoke({"messages": [HumanMessage(TASK, id="task")]}, config)
    for item in range(1, batches + 1):
        arm.graph.invoke({"messages": [HumanMessage(batch(item, words), id=f"b{item}")]}, config)
        out = arm.graph.invoke(
            {"messages": [HumanMessage(batch(item, words), id=f"b{item}")]}, config
        )
    assert arm.keeper is not None
    archived = [
        t
        for t in arm.keeper.archive.turns(config["configurable"]["thread_id"])
        if t.role == "human"
    ]
    # every batch but the newest has been worked through and left, each once and word for word
    assert [t.content for t in archived] == [batch(i, words) for i in range(1, batches)]
    assert [t.item for t in archived] == list(range(1, batches))
    in_view = [text_of(m) for m in out["messages"] if text_of(m).startswith("Item ")]
    assert in_view == [batch(batches, words)]
    arm.close()


def test_the_read_mode_archives_no_turn_but_keeps_every_version_of_its_state():
    arm = build_arm("self_edit", scripted_writer("lines"), window=2048)
    config = thread("read-mode")
    arm.graph.invoke({"messages": [HumanMessage(TASK, id="task")]}, config)
    for item in range(1, 6):
        out = arm.graph.invoke({"messages": [HumanMessage(batch(item), id=f"b{item}")]}, config)
    assert arm.keeper is not None and arm.keeper.archive.turn_count("read-mode") == 0
    versions = list(arm.keeper.archive.notes_versions("read-mode"))
    assert [v.last_item for v in versions] == [1, 2, 3, 4]
    assert "domo04 12" in versions[-1].text and "domo04 12" in pinned_of(out["messages"])
    arm.close()


def test_a_rule_line_edit_sent_through_the_graph_is_refused_and_the_rule_stays_pinned():
    script = [
        AIMessage("", tool_calls=[call("memory_rule", {"rule": RULE}, 1)]),
        AIMessage("Kept."),
        AIMessage(
            "",
            tool_calls=[
                call("memory_delete", {"name": "RULE"}, 2),
                call("memory_set", {"name": "RULE:", "value": "the counters are public"}, 3),
                call("memory_set", {"name": "katu85", "value": "9"}, 4),
            ],
        ),
        AIMessage("Done."),
    ]
    model = ScriptedChatModel(script=script)
    arm = build_arm("self_edit_rules", model, window=4096)
    config = thread("rules")
    arm.graph.invoke(
        {"messages": [HumanMessage(TASK, id="task"), HumanMessage(f"Item 1.\n{RULE}", id="b1")]},
        config,
    )
    out = arm.graph.invoke(
        {"messages": [HumanMessage("Item 2.\nThe rain kept on.", id="b2")]}, config
    )
    replies = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [r.content.startswith("Refused: RULE: lines are permanent") for r in replies] == [
        True,
        True,
        False,
    ]
    pinned = pinned_of(out["messages"])
    assert f"RULE: {RULE}" in pinned and "katu85 9" in pinned and "public" not in pinned
    arm.close()


def test_the_free_text_arm_keeps_the_prose_its_model_wrote_word_for_word():
    arm = build_arm("free_notes", scripted_writer("prose"), window=4096)
    config = thread("prose")
    arm.graph.invoke({"messages": [HumanMessage(TASK, id="task")]}, config)
    for item in range(1, 5):
        out = arm.graph.invoke({"messages": [HumanMessage(batch(item), id=f"b{item}")]}, config)
    pinned = pinned_of(out["messages"])
    assert [line for line in pinned.split("\n\n", 1)[1].splitlines()] == [
        f"In item {i} Mira Holt set domo{i:02d}." for i in range(1, 5)
    ]
    assert arm.keeper is not None
    last = list(arm.keeper.archive.notes_versions("prose"))[-1]
    assert "In item 3 Mira Holt set domo03." in last.text
    arm.close()


def test_the_model_is_shown_its_memory_tools_and_the_archive_search_where_there_is_one():
    for name, tools in (
        ("self_edit", {"memory_set", "memory_delete"}),
        ("self_edit_archive", {"memory_set", "memory_delete", "search_archive"}),
        ("self_edit_rules", {"memory_set", "memory_delete", "memory_rule", "search_archive"}),
        ("free_notes", {"notes_append", "notes_replace", "search_archive"}),
    ):
        model = ScriptedChatModel(default="OK.")
        arm = build_arm(name, model, window=4096)
        arm.graph.invoke({"messages": [HumanMessage(TASK)]}, thread(name))
        assert set(model.received[-1].tools) == tools, name
        arm.close()


# ------------------------------------------------------------------------------ the simulated reader


def drive(name: str, folder, window: int, reader: SimulatedReader | None = None):
    arm = build_arm(
        name,
        reader or SimulatedReader(),
        window=window,
        domain="counters",
        passages=STREAM_PASSAGES,  # as the benchmark runs its arms on the streams
    )
    config = thread(name)
    arm.graph.invoke({"messages": [HumanMessage(TASK)]}, config)
    replies = {}
    out = {}
    for record in read_stream(folder):
        out = arm.graph.invoke({"messages": [HumanMessage(record["text"])]}, config)
        if record["type"] == "questions":
            last = [m for m in out["messages"] if isinstance(m, AIMessage)][-1]
            replies[(record["after_item"], record["final"])] = text_of(last)
    result = grade(question_sets(folder), replies, reader=SIMULATED_READER, label=name)
    arm.close()
    return result, out


@pytest.fixture(scope="module", params=[("tiny", 0, 4096), ("tiny", 1, 4096), ("tiny", 2, 6144)])
def rule_stream(request, tmp_path_factory):
    size, seed, window = request.param
    folder = tmp_path_factory.mktemp(f"{size}-{seed}")
    generate_stream(
        preset_spec(size, seed=seed, families=frozenset({"rules", "overdrawn"})), folder
    )
    return folder, window


def rule_score(result) -> tuple[int, int]:
    right = sum(result.by_category.get(c, (0, 0))[0] for c in ("rule", "overdrawn"))
    asked = sum(result.by_category.get(c, (0, 0))[1] for c in ("rule", "overdrawn"))
    return right, asked


def test_a_rule_stays_only_where_the_pinned_state_has_a_place_for_it(rule_stream):
    folder, window = rule_stream
    lines, _ = drive("self_edit_archive", folder, window)
    ruled, out = drive("self_edit_rules", folder, window)
    assert rule_score(ruled)[0] == rule_score(ruled)[1] > 0, ruled.markdown()
    # name value lines have no place for "answer protected" or "report overdrawn"
    assert rule_score(lines)[0] < rule_score(lines)[1] / 2, lines.markdown()
    assert read_pinned(pinned_of(out["messages"])).rules


def test_only_an_archive_keeps_who_changed_a_counter(rule_stream):
    folder, window = rule_stream
    read_mode, _ = drive("self_edit", folder, window)
    archived, _ = drive("self_edit_archive", folder, window)
    who_read, asked = read_mode.by_category["who"]
    assert asked > 0 and who_read == 0, read_mode.markdown()
    assert archived.by_category["who"][0] == asked, archived.markdown()
    # current values live in the pinned lines either way
    assert read_mode.by_category["current"] == archived.by_category["current"]


def test_the_free_text_reader_writes_its_notes_as_prose_and_reads_them_back(rule_stream):
    folder, window = rule_stream
    result, out = drive("free_notes", folder, window)
    view = read_pinned(pinned_of(out["messages"]))
    assert view.prose and not view.lines and not view.rules
    assert any(line.startswith("Standing rule:") for line in view.prose)
    assert all(line.endswith(".") for line in view.prose)
    assert result.by_category["current"][0] == result.by_category["current"][1], result.markdown()


def test_a_misread_is_written_into_the_pinned_state_as_read(rule_stream):
    folder, window = rule_stream
    faulty = SimulatedReader(faults=ReaderFaults(sign_flip=1.0, seed=3))
    _, out = drive("self_edit", folder, window, reader=faulty)
    _, clean = drive("self_edit", folder, window)
    values = read_pinned(pinned_of(out["messages"])).values()
    truth = read_pinned(pinned_of(clean["messages"])).values()
    assert values.keys() == truth.keys() and values != truth


@pytest.mark.parametrize("window", [2048, 4096])
def test_a_reader_out_of_room_removes_what_it_set_least_recently_and_keeps_the_newest(window):
    """Many counters in a small state: the newest values are kept, the oldest make room."""
    arm = build_arm("self_edit", SimulatedReader(), window=window)
    config = thread(f"room-{window}")
    arm.graph.invoke({"messages": [HumanMessage(TASK)]}, config)
    for item in range(1, 41):
        sentences = " ".join(
            f"Mira Holt recorded qa{'wxyz'[n]}{item:02d} at {item * 10 + n}." for n in range(4)
        )
        out = arm.graph.invoke({"messages": [HumanMessage(f"Item {item}.\n{sentences}")]}, config)
    view = read_pinned(pinned_of(out["messages"]))
    assert 0 < view.used <= view.budget
    assert view.lines[-1] == ("qaz40", "403")
    assert ("qaw01", "10") not in view.lines  # the oldest made room
    arm.close()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_pinned_state_keeps_current_values_through_text_that_spans_two_batches(seed, tmp_path):
    """The varied stream's recounts begin in one batch and finish in the next: the reader keeps
    the open recount in its pinned state, as its notes keep it OPEN."""
    spec = StreamSpec(
        seed=seed,
        target_tokens=15_000,
        families=frozenset({"varied"}),
        question_every=6,
        filler_sentences=(4, 10),
    )
    generate_stream(spec, tmp_path)
    result, _ = drive("self_edit", tmp_path, 6144)
    assert result.by_category["current"][0] == result.by_category["current"][1], result.markdown()


def test_the_archive_search_budget_starts_over_when_a_new_batch_arrives():
    """The keeper's loop guards serve the self-editing arms too: past the search budget every
    search is stopped, until new input may have changed the archive."""
    searches = [
        AIMessage("", tool_calls=[call("search_archive", {"query": f"domo{n:02d}"}, n)])
        for n in range(12)
    ]
    model = ScriptedChatModel(script=["OK.", "Read 1.", "Read 2.", *searches, "1. unknown"])
    arm = build_arm("self_edit_archive", model, window=4096)
    config = thread("guards")
    arm.graph.invoke({"messages": [HumanMessage(TASK, id="task")]}, config)
    for item in (1, 2):
        arm.graph.invoke({"messages": [HumanMessage(batch(item), id=f"b{item}")]}, config)
    asked = HumanMessage("Questions about the stories so far.\n1. What value does domo01 hold now?")
    out = arm.graph.invoke({"messages": [asked]}, config)
    replies = [text_of(m) for m in out["messages"] if isinstance(m, ToolMessage)]
    # the stop line is given once; a search past it is refused in a few tokens
    assert any(r.startswith("Refused:") and "Stop searching" in r for r in replies)
    assert replies[-1].startswith("Refused:")
    model.script.append(AIMessage("", tool_calls=[call("search_archive", {"query": "domo01"}, 99)]))
    model.script.append(AIMessage("Read."))
    out = arm.graph.invoke({"messages": [HumanMessage(batch(3), id="b3")]}, config)
    after = [text_of(m) for m in out["messages"] if isinstance(m, ToolMessage)]
    assert after[-1].startswith("Found"), after[-1]
    arm.close()
