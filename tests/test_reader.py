"""The simulated reader knows only what its context holds, and says so."""

from __future__ import annotations

import ast
import operator
import re

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from keeper_middleware.bench import reader as reader_module
from keeper_middleware.bench.phrasing import render_questions_message
from keeper_middleware.bench.reader import SimulatedReader
from keeper_middleware.changes import NoChanges, RuleLine, SetLine, parse_changes
from keeper_middleware.notes import Notes, parse_notes, render_notes
from keeper_middleware.numbers import amounts_in

CONFIDENTIAL = (
    "Standing rule: the counters kelo12, varu55 and tisa09 are confidential; whenever asked for "
    "the value of one of them, answer with the single word protected."
)
TALLY = "House method: the tally of a counter is its value times five plus thirteen."
OVERDRAWN = (
    "Standing rule: any figure below zero, whether recorded or worked out, is reported as the "
    "single word overdrawn."
)
ITEM_1_STORY = (
    "The rain kept on. The clerk recorded domo86 at three hundred and forty-two. "
    "Mira Holt recorded kibu12 at 5. The market was quiet. Tomas Quill recorded kelo12 at 40."
)
ITEM_2 = (
    "Item 2.\nThe wind rose. Ten were taken from domo86 by Tomas Quill. Next on the list was "
    "kibu12. Mira Holt took 9 from it. Ana Berg added to domo86 as much as kibu12 held."
)
# True values after item 2: domo86 = 342 - 10 + (5 - 9) = 328; kibu12 = -4; kelo12 = 40.

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search_archive",
        "description": "Search the archive.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
    },
}
READ_TOOL = {
    "type": "function",
    "function": {
        "name": "read_next_batch",
        "description": "Next batch.",
        "parameters": {"type": "object", "properties": {}},
    },
}


def item_1(*rules: str) -> str:
    return "\n".join(["Item 1.", *rules, ITEM_1_STORY])


def questions(*lines: str) -> HumanMessage:
    return HumanMessage(render_questions_message(list(enumerate(lines, start=1))))


def story(*batches: str) -> list[BaseMessage]:
    """System, task, then each batch as a user message with the reader's acknowledgement."""
    messages: list[BaseMessage] = [
        SystemMessage("You read stories about counters."),
        HumanMessage("Read the stories."),
    ]
    for batch in batches:
        number = re.match(r"Item (\d+)\.", batch)
        messages += [
            HumanMessage(batch),
            AIMessage(f"Read item {number.group(1) if number else '?'}."),
        ]
    return messages


def answers(reply: BaseMessage) -> dict[int, str]:
    return {
        int(m.group(1)): m.group(2)
        for m in re.finditer(r"^(\d+)\. (.+)$", str(reply.content), re.M)
    }


def notes_message(notes: Notes, kept: int = 0) -> HumanMessage:
    return HumanMessage(render_notes(notes, kept=kept), additional_kwargs={"keeper": "notes"})


def notes_request() -> HumanMessage:
    return HumanMessage(
        "[NOTES REQUEST] Write down what the turns since the NOTES changed.\nReply with change lines only.",
        additional_kwargs={"keeper": "notes_request"},
    )


def search_result(call: dict, text: str) -> ToolMessage:
    return ToolMessage(text, tool_call_id=call["id"], name="search_archive")


ALL_QUESTIONS = (
    "What value does domo86 hold now?",
    "What value did domo86 hold at the end of item 1?",
    "Who changed domo86 in item 2?",
    "What is the tally of domo86 now?",
    "What value does kibu12 hold now?",
)


def test_it_answers_from_the_batches_in_view():
    reply = SimulatedReader().invoke([*story(item_1(TALLY), ITEM_2), questions(*ALL_QUESTIONS)])
    assert answers(reply) == {1: "328", 2: "342", 3: "Tomas Quill", 4: str(328 * 5 + 13), 5: "-4"}


def test_it_is_labelled_a_simulated_reader_not_a_language_model():
    reader = SimulatedReader()
    reply = reader.invoke([HumanMessage("Hello.")])
    assert reader._llm_type == "simulated-reader"
    assert reply.response_metadata["model_name"] == "simulated-reader"
    doc = reader_module.__doc__ or ""
    assert "NOT a language model" in doc and '"simulated reader"' in doc


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


def test_with_the_search_tool_it_searches_for_what_its_context_lacks():
    reader = SimulatedReader().bind_tools([SEARCH_TOOL])
    reply = reader.invoke([*story(ITEM_2), questions("What value does domo86 hold now?")])
    # domo86 needs its set (before item 2) and kibu12's value at the held change.
    assert [call["args"] for call in reply.tool_calls] == [{"query": "domo86", "to_item": 1}]
    assert reply.response_metadata["finish_reason"] == "tool_calls"


def test_it_answers_from_search_results_and_searches_again_for_what_they_still_lack():
    reader = SimulatedReader().bind_tools([SEARCH_TOOL])
    history = [*story(ITEM_2), questions("What value does domo86 hold now?")]
    first = reader.invoke(history)
    history += [
        first,
        search_result(
            first.tool_calls[0],
            (
                'Found 1 match for "domo86".\nitem 1: The clerk recorded domo86 at three hundred and '
                "forty-two. → next: Mira Holt recorded kibu12 at 5."
            ),
        ),
    ]
    second = reader.invoke(history)
    # The next sentence is shown but is not a match: kibu12 is still searched for properly.
    assert [call["args"] for call in second.tool_calls] == [{"query": "kibu12", "to_item": 1}]
    history += [
        second,
        search_result(
            second.tool_calls[0],
            (
                'Found 2 matches for "kibu12".\nitem 1: Mira Holt recorded kibu12 at 5. → next: The market was quiet.\n'
                "item 2: Next on the list was kibu12. → next: Mira Holt took 9 from it."
            ),
        ),
    ]
    assert answers(reader.invoke(history)) == {1: "328"}


def test_a_search_that_finds_nothing_gives_unknown_and_is_not_sent_again():
    reader = SimulatedReader().bind_tools([SEARCH_TOOL])
    history = [*story(ITEM_2), questions("What value did zaro55 hold at the end of item 1?")]
    first = reader.invoke(history)
    assert first.tool_calls[0]["args"] == {"query": "zaro55", "to_item": 1}
    history += [first, search_result(first.tool_calls[0], 'No matches for "zaro55".')]
    assert answers(reader.invoke(history)) == {1: "unknown"}


def test_a_list_cut_short_is_narrowed_later_half_first():
    reader = SimulatedReader().bind_tools([SEARCH_TOOL])
    batches = [f"Item {n}.\nThe day passed quietly." for n in range(1, 41)]
    history = [
        *story(*batches[30:]),
        questions("What value did domo86 hold at the end of item 20?"),
    ]
    first = reader.invoke(history)
    assert first.tool_calls[0]["args"] == {"query": "domo86", "to_item": 20}
    cut = 'Showing 1 of 12 matches for "domo86" (the list is cut short; these are the nearest to the query; narrow it with from_item/to_item).\nitem 3: Mira Holt took 4 from domo86. → next: The day passed.'
    history += [first, search_result(first.tool_calls[0], cut)]
    second = reader.invoke(history)
    assert second.tool_calls[0]["args"] == {"query": "domo86", "from_item": 11, "to_item": 20}


def test_a_refused_command_is_not_sent_again_and_the_stop_line_is_obeyed():
    reader = SimulatedReader().bind_tools([SEARCH_TOOL])
    history = [*story(ITEM_2), questions("What value did domo86 hold at the end of item 1?")]
    first = reader.invoke(history)
    history += [first, search_result(first.tool_calls[0], "Refused: that search was just made.")]
    assert answers(reader.invoke(history)) == {1: "unknown"}

    stopped = [
        *story(ITEM_2),
        questions("What value did domo86 hold at the end of item 1?"),
        HumanMessage("Stop searching now and answer with what you have."),
    ]
    reply = reader.invoke(stopped)
    assert reply.tool_calls == [] and answers(reply) == {1: "unknown"}


def test_it_searches_at_most_four_times_per_turn_in_question_order():
    reader = SimulatedReader().bind_tools([SEARCH_TOOL])
    names = ["aaa01", "bbb02", "ccc03", "ddd04", "eee05"]
    reply = reader.invoke(
        [*story(ITEM_2), questions(*(f"What value does {n} hold now?" for n in names))]
    )
    assert [call["args"]["query"] for call in reply.tool_calls] == names[:4]


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


def _evaluate(working: str) -> int:
    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.BinOp):
            return ops[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        assert isinstance(node, ast.Constant)
        return int(node.value)

    return walk(ast.parse(working, mode="eval").body)


def test_note_changes_for_two_batches_are_correct_show_their_working_and_parse():
    history = [*story(item_1(TALLY), ITEM_2), notes_request()]
    reply = SimulatedReader().invoke(history)
    parsed = parse_changes(str(reply.content))
    assert parsed.garbage == ()
    assert parsed.changes == (
        RuleLine(TALLY),
        SetLine("domo86", "328", "342 - 10 + (5 - 9)"),
        SetLine("kibu12", "-4", "5 - 9"),
        SetLine("kelo12", "40"),
    )
    text = item_1(TALLY) + ITEM_2
    for change in parsed.changes:
        if isinstance(change, SetLine) and change.working:
            assert _evaluate(change.working) == int(change.value)
            used = {abs(int(n)) for n in re.findall(r"\d+", change.working)}
            assert used <= amounts_in(text)


def test_note_changes_work_from_the_notes_value_and_skip_messages_already_noted():
    notes = Notes(state=(("domo86", "342"), ("kibu12", "5")), first_item=1, last_item=1)
    history = [
        SystemMessage("s"),
        HumanMessage("task"),
        notes_message(notes, kept=2),
        HumanMessage("Item 1.\nMira Holt took 3 from domo86."),
        AIMessage("Read item 1."),
        HumanMessage(ITEM_2),
        AIMessage("Read item 2."),
        notes_request(),
    ]
    parsed = parse_changes(str(SimulatedReader().invoke(history).content))
    assert parsed.changes == (
        SetLine("domo86", "328", "342 - 10 + (5 - 9)"),
        SetLine("kibu12", "-4", "5 - 9"),
    )


def test_nothing_changed_gives_no_changes_and_an_unknown_base_is_skipped():
    quiet = [*story("Item 3.\nThe day passed quietly."), notes_request()]
    assert parse_changes(str(SimulatedReader().invoke(quiet).content)).changes == (NoChanges(),)
    unknown_base = [*story("Item 3.\nMira Holt took 3 from domo86."), notes_request()]
    assert parse_changes(str(SimulatedReader().invoke(unknown_base).content)).changes == (
        NoChanges(),
    )


def test_the_rewrite_request_gets_a_complete_notes_block():
    rewrite = HumanMessage(
        "[NOTES REQUEST] Rewrite the NOTES to cover everything so far.\nReply with the complete NOTES."
    )
    reply = SimulatedReader().invoke([*story(item_1(CONFIDENTIAL), ITEM_2), rewrite])
    notes, kept = parse_notes(str(reply.content))
    assert kept == 0
    assert notes.rules == (CONFIDENTIAL,)
    assert notes.state == (("domo86", "328"), ("kibu12", "-4"), ("kelo12", "40"))
    assert (notes.first_item, notes.last_item) == (1, 2)


def test_batches_are_acknowledged_and_read_through_the_tool_in_tool_mode():
    assert SimulatedReader().invoke(story(ITEM_2)[:3]).content == "Read item 2."
    reader = SimulatedReader().bind_tools([READ_TOOL, SEARCH_TOOL])
    task = [
        SystemMessage("s"),
        HumanMessage("Call read_next_batch until it says there are no more."),
    ]
    first = reader.invoke(task)
    assert [call["name"] for call in first.tool_calls] == ["read_next_batch"]
    batch = ToolMessage(ITEM_2, tool_call_id=first.tool_calls[0]["id"], name="read_next_batch")
    second = reader.invoke([*task, first, batch])
    assert [call["name"] for call in second.tool_calls] == ["read_next_batch"]
    done = ToolMessage(
        "No more batches for now.", tool_call_id=second.tool_calls[0]["id"], name="read_next_batch"
    )
    assert reader.invoke([*task, first, batch, second, done]).content == "Done reading."


def test_it_is_stateless_and_deterministic_and_reports_usage():
    reader = SimulatedReader().bind_tools([SEARCH_TOOL])
    history = [*story(ITEM_2), questions("What value does domo86 hold now?")]
    one, other = reader.invoke(history), reader.invoke(history)
    assert one.tool_calls == other.tool_calls and one.content == other.content
    usage = one.usage_metadata
    sent = sum(len(str(m.content)) for m in history)
    assert usage["input_tokens"] == pytest.approx(sent / 4, abs=len(history))
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert one.response_metadata == {
        "finish_reason": "tool_calls",
        "model_name": "simulated-reader",
    }


def test_bind_tools_returns_a_copy_and_reasoning_effort_is_recorded():
    reader = SimulatedReader()
    bound = reader.bind_tools([SEARCH_TOOL])
    assert reader.bound_tools == () and bound.bound_tools == ("search_archive",)
    reply = reader.invoke([HumanMessage("Hello.")], reasoning_effort="medium")
    assert reply.response_metadata["reasoning_effort"] == "medium"


def test_it_works_inside_a_langchain_agent_with_tools():
    from langchain.agents import create_agent
    from langchain_core.tools import tool

    batches = [item_1(TALLY), ITEM_2]

    @tool
    def read_next_batch() -> str:
        """Read the next batch of stories."""
        return batches.pop(0) if batches else "No more batches for now."

    agent = create_agent(SimulatedReader(), tools=[read_next_batch])
    result = agent.invoke(
        {"messages": [HumanMessage("Call read_next_batch until it says there are no more.")]}
    )
    assert result["messages"][-1].content == "Done reading."
    followup = agent.invoke(
        {"messages": [*result["messages"], questions("What is the tally of domo86 now?")]}
    )
    assert answers(followup["messages"][-1]) == {1: str(328 * 5 + 13)}


# ---------------------------------------------------------------------------------------------
# Against the stream generator's truth
# ---------------------------------------------------------------------------------------------
def _generated_stream(tmp_path, seed: int, *, varied: bool = True):
    from keeper_middleware.bench.streams import (
        FAMILIES,
        SIZES,
        StreamSpec,
        generate_stream,
        read_stream,
    )

    families = FAMILIES if varied else FAMILIES - {"varied"}
    generate_stream(StreamSpec(seed=seed, families=families, **SIZES["tiny"]), tmp_path)
    return list(read_stream(tmp_path))


def _wrong_answers(record: dict, reply: BaseMessage) -> list[tuple[dict, str | None]]:
    from keeper_middleware.bench.grader import answers_match, parse_answer_lines

    given = parse_answer_lines(str(reply.content))
    return [
        (question, given.get(question["number"]))
        for question in record["questions"]
        if not answers_match(str(question["answer"]), given.get(question["number"], ""))
    ]


def test_with_every_batch_in_view_it_answers_every_generated_question_right(tmp_path):
    reader = SimulatedReader()
    history: list[BaseMessage] = [SystemMessage("s"), HumanMessage("Read the stories.")]
    wrong, asked = [], 0
    for record in _generated_stream(tmp_path, seed=3):
        if record["type"] == "batch":
            history += [HumanMessage(record["text"]), AIMessage(f"Read item {record['item']}.")]
        elif record["type"] == "questions":
            wrong += _wrong_answers(record, reader.invoke([*history, HumanMessage(record["text"])]))
            asked += len(record["questions"])
    assert asked > 30 and wrong == []


def test_its_own_notes_plus_archive_search_answer_every_generated_question_right(tmp_path):
    """A small keeper loop: notes every six batches (parsed and applied by the core), the window
    emptied, and the archive searched through the keyword retriever and the core's guards.

    Without the varied family: a search finds the sentences that name a counter and the one
    after, so the later links of a pronoun chain are out of its reach (that loss is the method's,
    and shows in the varied streams' scores)."""
    from keeper_middleware.changes import apply_changes
    from keeper_middleware.note_taking import notes_request_text
    from keeper_middleware.retrievers.keyword import KeywordRetriever
    from keeper_middleware.retrievers.sentences import passages_from_text
    from keeper_middleware.search import GuardState, SearchCommand, decide, render_results

    reader = SimulatedReader().bind_tools([SEARCH_TOOL])
    archive = KeywordRetriever()
    head: list[BaseMessage] = [SystemMessage("s"), HumanMessage("Read the stories.")]
    notes, window, position, first = Notes(), [], 0, None
    wrong: list = []

    def with_notes(*messages: BaseMessage) -> list[BaseMessage]:
        return [*head, notes_message(notes), *window, *messages]

    for record in _generated_stream(tmp_path / "stream", seed=11, varied=False):
        if record["type"] == "batch":
            window += [HumanMessage(record["text"]), AIMessage(f"Read item {record['item']}.")]
            first = first or record["item"]
            passages = passages_from_text("s", record["item"], record["text"], position)
            archive.add(passages)
            position += len(passages)
            if len(window) == 12:
                request = HumanMessage(
                    notes_request_text(), additional_kwargs={"keeper": "notes_request"}
                )
                changes = parse_changes(str(reader.invoke(with_notes(request)).content)).changes
                notes = apply_changes(notes, changes).covering(first, record["item"])
                window = []
        elif record["type"] == "questions":
            history, guards = with_notes(HumanMessage(record["text"])), GuardState()
            for _ in range(30):
                reply = reader.invoke(history)
                history.append(reply)
                if not reply.tool_calls:
                    break
                for call in reply.tool_calls:
                    command = SearchCommand(
                        call["args"]["query"],
                        call["args"].get("from_item"),
                        call["args"].get("to_item"),
                    )
                    decision = decide(guards, command)
                    guards = decision.state
                    text = decision.message
                    if decision.verdict == "run":
                        hits = archive.search(
                            command.query,
                            session="s",
                            k=11,
                            from_item=command.from_item,
                            to_item=command.to_item,
                        )
                        text = render_results(command, hits, shown=10, scanned=11)
                    history.append(search_result(call, text))
            wrong += _wrong_answers(record, reply)
    assert wrong == [], wrong


@pytest.mark.anyio
async def test_async_calls_give_the_same_replies():
    reader = SimulatedReader().bind_tools([SEARCH_TOOL])
    for history in (
        [*story(ITEM_2), questions(*ALL_QUESTIONS)],
        [*story(item_1(TALLY), ITEM_2), questions(*ALL_QUESTIONS)],
    ):
        sync, asynchronous = reader.invoke(history), await reader.ainvoke(history)
        assert (sync.content, sync.tool_calls) == (asynchronous.content, asynchronous.tool_calls)
