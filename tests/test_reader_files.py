"""Offered file tools and told where the history went, the simulated reader reads it back: it
greps the file for the name asked about, reads up to each match's batch head, and answers from
the batches it read, as it answers from archive search results. Without the tools, or without a
file named in its context, it does not try; the archive search's faults and budget reach its
file calls alike; and a summary of a conversation sent as text keeps its unanswered question set
and leaves out what was read back from the file."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from keeper_bench.reader import ReaderFaults, SimulatedReader
from keeper_bench.reader.model import file_turn_budget
from keeper_bench.reader.summary import unanswered_in_transcript, without_file_results
from tests.reader_stories import answers, questions

HISTORY = "/conversation_history/session_1.md"
DEEP_AGENTS_TOOLS = ["ls", "read_file", "write_file", "edit_file", "glob", "grep", "task"]
FILE_LINES = [
    "## Summarized at 2026-01-01T00:00:00+00:00",
    "",
    '<message type="human">Item 1.',
    "Mira Holt recorded domo86 at 342.</message>",
    '<message type="ai">Read item 1.</message>',
    '<message type="human">Item 2.',
    "The shepherd carried hay to the barn. Five were added to domo86 by Tomas Lind.",
    "The barn smelled of rope.</message>",
    '<message type="ai">Read item 2.</message>',
]
"""The file as Deep Agents writes it (``get_buffer_string(format="xml")`` under a section head)."""


def offloaded_context() -> list[BaseMessage]:
    """What a Deep Agents agent sends after a summary: domo86 is only in the file."""
    summary = HumanMessage(
        "You are in the middle of a conversation that has been summarized.\n\n"
        f"The full conversation history has been saved to {HISTORY} should you need to refer "
        "back to it for details.\n\nA condensed summary follows:\n\n<summary>\n"
        "item 2: kibu12 stood at 5.\n</summary>"
    )
    return [
        summary,
        HumanMessage("Item 3.\nThe goat wandered past the mill."),
        AIMessage("Read item 3."),
        questions("What value does domo86 hold now?"),
    ]


def tool_output(call: dict[str, Any]) -> str:
    """What Deep Agents' grep (content mode) and read_file return for ``FILE_LINES``."""
    args = call["args"]
    if call["name"] == "grep":
        found = [
            f"  {n}: {line}"
            for n, line in enumerate(FILE_LINES, start=1)
            if args["pattern"] in line
        ]
        return f"{HISTORY}:\n" + "\n".join(found) if found else "No matches found"
    first = args["offset"] + 1
    last = min(len(FILE_LINES), args["offset"] + args["limit"])
    body = "\n".join(FILE_LINES[first - 1 : last])
    return f"@@ lines {first}-{last} of {len(FILE_LINES)} | next offset {last} @@\n{body}"


def run_turn(reader: Any, history: list[BaseMessage], *, most: int = 20) -> list[AIMessage]:
    """Send the turn until the reader answers, each file call answered from ``FILE_LINES``."""
    replies: list[AIMessage] = []
    for _ in range(most):
        reply = reader.invoke(history)
        replies.append(reply)
        if not reply.tool_calls:
            return replies
        history = [
            *history,
            reply,
            *(
                ToolMessage(tool_output(call), tool_call_id=call["id"], name=call["name"])
                for call in reply.tool_calls
            ),
        ]
    raise AssertionError(f"no answer after {most} replies")


def test_it_greps_the_offloaded_file_reads_to_the_batch_heads_and_answers_from_it():
    reader = SimulatedReader().bind_tools(DEEP_AGENTS_TOOLS)
    replies = run_turn(reader, offloaded_context())
    calls = [(c["name"], c["args"]) for reply in replies for c in reply.tool_calls]
    assert calls == [
        ("grep", {"pattern": "domo86", "path": HISTORY, "output_mode": "content"}),
        # the newest match (line 7) and the lines above it, up to its head (line 6)
        ("read_file", {"file_path": HISTORY, "offset": 3, "limit": 5}),
        # the older match (line 4) began above what was read: up to its head (line 3)
        ("read_file", {"file_path": HISTORY, "offset": 0, "limit": 3}),
    ]
    assert answers(replies[-1]) == {1: "347"}


def test_without_file_tools_or_a_file_named_it_answers_from_what_is_in_view():
    without_tools = SimulatedReader().bind_tools(["ls", "write_file", "task"])
    reply = without_tools.invoke(offloaded_context())
    assert not reply.tool_calls
    assert answers(reply) == {1: "unknown"}
    unnamed = offloaded_context()
    unnamed[0] = HumanMessage("Here is a summary of the conversation to date:\n\nNothing yet.")
    reply = SimulatedReader().bind_tools(DEEP_AGENTS_TOOLS).invoke(unnamed)
    assert not reply.tool_calls
    assert answers(reply) == {1: "unknown"}


def test_going_round_in_circles_it_greps_three_ways_until_the_turn_budget_is_spent():
    reader = SimulatedReader(faults=ReaderFaults(circle_searches=1.0)).bind_tools(DEEP_AGENTS_TOOLS)
    replies = run_turn(reader, offloaded_context())
    calls = [c for reply in replies for c in reply.tool_calls]
    assert len(calls) == file_turn_budget(1)  # the keeper's search budget for one question
    assert {c["name"] for c in calls} == {"grep"}
    assert len({repr(sorted(c["args"].items())) for c in calls}) == 3
    assert answers(replies[-1]) == {1: "unknown"}


def test_misreads_strike_the_batches_read_from_the_file():
    reader = SimulatedReader(faults=ReaderFaults(overlooked=1.0)).bind_tools(DEEP_AGENTS_TOOLS)
    replies = run_turn(reader, offloaded_context())
    assert len([c for reply in replies for c in reply.tool_calls]) == 3
    assert answers(replies[-1]) == {1: "unknown"}  # every change read is overlooked


def test_a_summary_of_a_transcript_keeps_its_open_question_set_and_not_what_the_file_showed():
    transcript = (
        '<messages>\n<message type="human">Item 4.\nMira Holt recorded domo86 at 9.</message>\n'
        '<message type="human">Questions about the stories so far. Answer each on its own '
        'line as "N. answer".\n1. What value does domo86 hold now?</message>\n'
        '<message type="ai">\n  <tool_call id="c1" name="read_file">{"file_path": "/h.md"}'
        "</tool_call>\n</message>\n"
        '<message type="tool">@@ lines 1-2 of 9 @@\n&lt;message type="human"&gt;Item 1.\n'
        "Mira Holt recorded domo86 at 342.&lt;/message&gt;</message>\n</messages>"
    )
    assert unanswered_in_transcript(transcript) == (
        'Questions about the stories so far. Answer each on its own line as "N. answer".\n'
        "1. What value does domo86 hold now?"
    )
    kept = without_file_results(transcript)
    assert "342" not in kept
    assert "recorded domo86 at 9" in kept
    answered = transcript.replace("</messages>", '<message type="ai">1. 9</message></messages>')
    assert unanswered_in_transcript(answered) is None


def test_a_batch_read_back_is_counted_once_beside_the_summarys_lines_for_its_item():
    context = offloaded_context()
    context[0] = HumanMessage(
        str(context[0].content).replace(
            "item 2: kibu12 stood at 5.",
            "item 2: Tomas Lind added 5 to domo86.\nitem 2: domo86 stood at 347.",
        )
    )
    context[-1] = questions(
        "What value does domo86 hold now?",
        "How many times did domo86 change from item 1 to item 2?",
    )
    replies = run_turn(SimulatedReader().bind_tools(DEEP_AGENTS_TOOLS), context)
    assert any(c["name"] == "read_file" for reply in replies for c in reply.tool_calls)
    # item 2's change is in the batch read back and in the summary: counted once
    assert answers(replies[-1]) == {1: "347", 2: "2"}
