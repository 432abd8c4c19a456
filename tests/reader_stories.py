"""Stories, questions and NOTES to put in front of the simulated reader, shared by its suites.

Item 1 sets three counters and item 2 changes two of them (the true values after item 2 are
noted below); the rules (a confidential set, a tally method, below zero as "overdrawn") are
sentences a batch or the NOTES may carry. ``story`` builds a context of batches with the reader's
acknowledgements, ``questions`` a question set, and ``answers`` reads the numbered answers back.
"""

from __future__ import annotations

import re

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from keeper_bench.phrasing import render_questions_message
from keeper_middleware.notes.block import Notes, render_notes

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
