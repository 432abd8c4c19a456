"""The simulated reader as a summariser: a SIMULATION of what a generous summariser keeps.

This is not a language model writing a summary. Asked for a summary (the summarize arm's
``[SUMMARY REQUEST]``, or LangChain's and langmem's own prompts: the last message is a user
message that speaks of a summary), it writes what a careful summariser would keep from what it
was sent, and nothing else:

- every rule and method sentence it sees, word for word;
- the current value of every counter it can work out from what it sees (a previous summary
  included), one line each, in the clerk's wording so that it reads back as a plain statement;
- a question set that has no answer yet, word for word (langmem's node can summarise away the
  very message that asked it).

It keeps no actors ("who did it") and no history of old values: that is what a summary loses,
and what this arm is measured for. Results from it are labelled "simulated reader".

langmem hands the model its summary in a system message; the reader reads system messages for
rules only, so :func:`summaries_in_view` shows such a summary as an ordinary message.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage

from keeper_middleware.bench.phrasing import (
    CLERK_TEMPLATE,
    apply_change,
    is_questions_message,
    read_events,
)
from keeper_middleware.bench.reader.messages import open_questions
from keeper_middleware.messages import keeper_kind, text_of

SUMMARY_REQUEST_TAG = "[SUMMARY REQUEST]"
LANGMEM_SUMMARY_START = "Summary of the conversation so far:"
_SUMMARY_RESULTS = (
    "[SUMMARY]",  # the summarize arm's stored summary
    "Here is a summary of the conversation to date",  # LangChain's
    LANGMEM_SUMMARY_START,
)
_RULE_SENTENCE = re.compile(r"(?:Standing rule|House method): [^.\n<]*\.")
_KEEPER_REQUESTS = frozenset({"notes_request", "notes_reask", "notes", "rules", "retrieved"})


def is_summary_request(messages: Sequence[BaseMessage]) -> bool:
    """The last message asks for a summary: the summarize arm's tag, or a user message that
    speaks of one and is neither story, questions, a stored summary nor a keeper message."""
    if not messages or not isinstance(messages[-1], HumanMessage):
        return False
    last = messages[-1]
    text = text_of(last).lstrip()
    if text.startswith(SUMMARY_REQUEST_TAG):
        return True
    if keeper_kind(last) in _KEEPER_REQUESTS or text.startswith("["):
        return False
    if text.startswith(_SUMMARY_RESULTS) or text.startswith("Item "):
        return False
    return "summar" in text.lower() and not is_questions_message(text)


def rule_sentences_in(texts: Sequence[str]) -> list[str]:
    """Rule and method sentences, word for word, each once, in the order first seen."""
    found: list[str] = []
    for text in texts:
        for sentence in _RULE_SENTENCE.findall(text):
            if sentence not in found:
                found.append(sentence)
    return found


def current_values(texts: Sequence[str]) -> dict[str, int]:
    """Every counter whose current value follows from the texts, replayed in order (a change to
    a counter whose value is unknown leaves it unknown until it is set again)."""
    values: dict[str, int | None] = {}
    for text in texts:
        for event in read_events(text):
            source = values.get(event.source) if event.source is not None else None
            values[event.name] = apply_change(values.get(event.name), event, source)
    return {name: value for name, value in values.items() if value is not None}


def write_summary(messages: Sequence[BaseMessage]) -> str:
    """The summary of everything sent, the request's own text included and read first: langmem
    puts the previous summary there (after the new messages, though it comes before them in the
    story), LangChain the whole conversation, the summarize arm nothing but the request."""
    texts = [text_of(message) for message in [*messages[-1:], *messages[:-1]]]
    lines = rule_sentences_in(texts)
    lines += [
        CLERK_TEMPLATE.format(name=name, amount=value)
        for name, value in current_values(texts).items()
    ]
    asked_at, _ = open_questions(messages[:-1])
    if asked_at is not None:  # a question set being summarised away is kept, word for word
        lines.append(text_of(messages[asked_at]))
    return "\n".join(lines) if lines else "Nothing to keep yet."


def summaries_in_view(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    """The messages with langmem's summary (a system message) shown as an ordinary message."""
    return [
        HumanMessage(content=text_of(message), id=message.id)
        if isinstance(message, SystemMessage)
        and text_of(message).lstrip().startswith(LANGMEM_SUMMARY_START)
        else message
        for message in messages
    ]
