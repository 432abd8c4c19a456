"""Reading the messages the simulated reader is sent: what each one is, and what it says.

Keeper messages are recognised by their tag, or by their text when the tag was lost on the way
(over HTTP). Story text comes in two shapes: whole batches ("Item N." and its sentences) and
item-tagged lines from search results or retrieved passages ("item N: ... → next: ..."); the two
are kept apart because a whole batch shows every change of its item and a passage line does not.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from langchain_core.messages import AIMessage, BaseMessage, SystemMessage, ToolMessage

from keeper_bench.reader.files import FILE_TOOLS
from keeper_bench.reader.pinned import is_pinned_text, pinned_notes
from keeper_bench.reader.text import (
    BATCH_HEAD_WORD,
    TEXTS_REMEMBERED,
    AskedQuestion,
    Event,
    Recount,
    open_recount,
    read_events,
    read_questions,
    read_story,
)
from keeper_middleware.messages.facts import keeper_kind, text_of
from keeper_middleware.notes.block import (
    NOTES_CHECK_TAG,
    NOTES_REQUEST_TAG,
    NOTES_TAG,
    RULES_TAG,
    Notes,
    parse_notes,
)

SEARCH_TOOL = "search_archive"
READ_TOOL = "read_next_batch"
STOP_LINE = "Stop searching now and answer with what you have."
NO_MORE_BATCHES = "No more batches for now."
REFUSED_PREFIX = "Refused:"
REWRITE_REQUEST_START = f"{NOTES_REQUEST_TAG} Rewrite the NOTES"

MessageKind = Literal[
    "system",
    "ai",
    "notes",
    "notes_request",
    "rewrite_request",
    "reask",
    "rules",
    "pinned",
    "search_result",
    "file_result",
    "input",
]
_KIND_BY_KEEPER_KEY = {
    "notes": "notes",
    "notes_reask": "reask",
    "rules": "rules",
    "pinned": "pinned",
}
_BATCH_HEAD = re.compile(rf"^{BATCH_HEAD_WORD} (\d+)\.", re.MULTILINE)
_PASSAGE = re.compile(r"^\s*(?:[-*]\s+)?item (\d+): (.+?)(?:\s*→ next: (.*?))?\s*$")
_MOVED_ENTRY = re.compile(r"- (\S+) = (-?\d+)")
_RESULT_HEAD = re.compile(r'^(?:Showing \d+ of (?:more than )?\d+|Found \d+|No) match(?:es)? for "')
_ANSWER_LINE = re.compile(r"^\s*\d+\.\s+\S", re.MULTILINE)


def message_kind(message: BaseMessage) -> MessageKind:
    """What a message is to the reader; keeper messages by their tag, or by their text when the
    tag was lost on the way (over HTTP)."""
    if isinstance(message, SystemMessage):
        return "system"
    if isinstance(message, AIMessage):
        return "ai"
    tagged = keeper_kind(message)
    text = text_of(message).lstrip()
    if tagged in _KIND_BY_KEEPER_KEY:
        return _KIND_BY_KEEPER_KEY[tagged]  # type: ignore[return-value]
    if tagged == "notes_request" or text.startswith(NOTES_REQUEST_TAG):
        return "rewrite_request" if text.startswith(REWRITE_REQUEST_START) else "notes_request"
    if is_pinned_text(text):
        return "pinned"
    for tag, kind in ((NOTES_TAG, "notes"), (NOTES_CHECK_TAG, "reask"), (RULES_TAG, "rules")):
        if text.startswith(tag):
            return kind  # type: ignore[return-value]
    if isinstance(message, ToolMessage) and message.name in FILE_TOOLS:
        return "file_result"
    if isinstance(message, ToolMessage) and (
        message.name == SEARCH_TOOL or _RESULT_HEAD.match(text) or text.startswith(REFUSED_PREFIX)
    ):
        return "search_result"
    return "input"


# ---------------------------------------------------------------------------------------------
# The story as the messages show it
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Block:
    """Story text from one message: a whole batch (``item`` from its head) or untagged text."""

    message_index: int
    item: int | None
    events: tuple[Event, ...]


@dataclass(frozen=True, slots=True)
class PassageLine:
    """One "item N: sentence → next: sentence" line of a search result or retrieved passage."""

    item: int
    rank: int
    """Position among the lines of the same item."""
    events: tuple[Event, ...]


def story_blocks(messages: Sequence[BaseMessage]) -> list[Block]:
    """Every piece of story text in the inputs, in reading order (passage lines excluded)."""
    return read_blocks(messages)[0]


def read_blocks(messages: Sequence[BaseMessage]) -> tuple[list[Block], Recount | None]:
    """The story blocks, and a recount still open after the last of them (one the NOTES keep
    open counts as begun before the first)."""
    _, notes, _ = notes_position(messages)
    recount = None
    if notes is not None:
        recount = next(filter(None, (open_recount(line) for line in notes.open)), None)
    pieces: list[tuple[int, int | None, str]] = []
    for index, message in enumerate(messages):
        if message_kind(message) != "input":
            continue
        pieces += [(index, item, piece) for item, piece in _batch_pieces(text_of(message))]
    read, recount = read_story([text for _, _, text in pieces], recount)
    blocks = [
        Block(index, item, tuple(events))
        for (index, item, _), events in zip(pieces, read, strict=True)
        if item is not None or events
    ]
    return blocks, recount


@lru_cache(maxsize=TEXTS_REMEMBERED)
def _batch_pieces(text: str) -> tuple[tuple[int | None, str], ...]:
    """(item, text) of each batch in a message ("Item N." to the next head; None for text before
    the first head), passage lines left out; remembered, as every request re-sends the batches."""
    text = "\n".join(line for line in text.splitlines() if not _PASSAGE.match(line))
    heads = list(_BATCH_HEAD.finditer(text))
    pieces: list[tuple[int | None, str]] = []
    if not heads or heads[0].start() > 0:
        pieces.append((None, text[: heads[0].start()] if heads else text))
    for number, head in enumerate(heads):
        end = heads[number + 1].start() if number + 1 < len(heads) else len(text)
        pieces.append((int(head.group(1)), text[head.start() : end]))
    return tuple(pieces)


def passage_lines(messages: Sequence[BaseMessage]) -> list[PassageLine]:
    """Item-tagged lines from search results and retrieved passages, each counted once, in item
    order and, within an item, in an order that agrees with every list they appeared in.

    A line's events are those of its matched sentence; the following sentence only resolves an
    "it" (its own changes are matches of their own when they concern the searched name).
    """
    by_item: dict[int, list[tuple[str, int]]] = {}
    events_of: dict[tuple[int, str, int], tuple[Event, ...]] = {}
    for message in messages:
        if message_kind(message) not in ("input", "search_result"):
            continue
        occurrences: dict[tuple[int, str], int] = {}
        cursor: dict[int, int] = {}
        for line in text_of(message).splitlines():
            match = _PASSAGE.match(line)
            if match is None:
                continue
            item, sentence, following = int(match.group(1)), match.group(2), match.group(3) or ""
            count = occurrences.get((item, sentence), 0)
            occurrences[(item, sentence)] = count + 1
            order = by_item.setdefault(item, [])
            if (sentence, count) in order:
                cursor[item] = order.index((sentence, count))
                continue
            cursor[item] = cursor.get(item, -1) + 1
            order.insert(cursor[item], (sentence, count))
            events = _moved_entry(sentence) or _without(
                read_events(f"{sentence} {following}"), read_events(following)
            )
            events_of[(item, sentence, count)] = tuple(events)
    return [
        PassageLine(item, rank, events_of[(item, sentence, count)])
        for item in sorted(by_item)
        for rank, (sentence, count) in enumerate(by_item[item])
    ]


def _moved_entry(sentence: str) -> list[Event]:
    """A NOTES entry the keeper moved to the archive ("- domo86 = 342"): the value the counter
    had at that item, read as a set with no actor."""
    match = _MOVED_ENTRY.fullmatch(sentence.strip())
    if match is None:
        return []
    return [Event("set", match.group(1), int(match.group(2)), None, "")]


def _without(events: list[Event], taken_out: list[Event]) -> list[Event]:
    remaining = list(events)
    for event in taken_out:
        if event in remaining:
            remaining.remove(event)
    return remaining


# ---------------------------------------------------------------------------------------------
# Searches made in this context
# ---------------------------------------------------------------------------------------------
SearchOutcome = Literal["complete", "cut_short", "refused", "pending"]


@dataclass(frozen=True, slots=True)
class SearchRecord:
    query: str
    from_item: int | None
    to_item: int | None
    outcome: SearchOutcome
    message_index: int

    @property
    def command(self) -> tuple[str, int | None, int | None]:
        return (self.query, self.from_item, self.to_item)


def search_args(query: str, from_item: int | None, to_item: int | None) -> dict[str, Any]:
    args: dict[str, Any] = {"query": query}
    if from_item is not None:
        args["from_item"] = from_item
    if to_item is not None:
        args["to_item"] = to_item
    return args


def _as_item(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def search_records(messages: Sequence[BaseMessage]) -> list[SearchRecord]:
    """The search commands sent in these messages and what each got back."""
    answers = {
        message.tool_call_id: text_of(message).lstrip()
        for message in messages
        if isinstance(message, ToolMessage)
    }
    records: list[SearchRecord] = []
    for index, message in enumerate(messages):
        if not isinstance(message, AIMessage):
            continue
        for call in message.tool_calls:
            if call["name"] != SEARCH_TOOL:
                continue
            args = call["args"]
            answer = answers.get(call.get("id") or "")
            outcome: SearchOutcome = "pending"
            if answer is not None:
                if answer.startswith(REFUSED_PREFIX) or answer.startswith(STOP_LINE):
                    outcome = "refused"
                elif answer.startswith("Showing") or "cut short" in answer.split("\n", 1)[0]:
                    outcome = "cut_short"
                else:
                    outcome = "complete"
            records.append(
                SearchRecord(
                    str(args.get("query", "")),
                    _as_item(args.get("from_item")),
                    _as_item(args.get("to_item")),
                    outcome,
                    index,
                )
            )
    return records


def notes_position(messages: Sequence[BaseMessage]) -> tuple[int | None, Notes | None, int]:
    """Index of the last NOTES message (or a self-editing arm's pinned state, read as NOTES),
    the notes it holds, and how many messages it says are already noted; (None, None, 0)
    without one."""
    for index in range(len(messages) - 1, -1, -1):
        if message_kind(messages[index]) == "pinned":
            return index, pinned_notes(text_of(messages[index])), 0
        if message_kind(messages[index]) == "notes":
            try:
                notes, kept = parse_notes(text_of(messages[index]))
            except ValueError:
                return index, None, 0
            return index, notes, kept
    return None, None, 0


# ---------------------------------------------------------------------------------------------
# Where the conversation stands
# ---------------------------------------------------------------------------------------------
def open_questions(messages: Sequence[BaseMessage]) -> tuple[int | None, list[AskedQuestion]]:
    """The last question set with no answer after it, and its questions; (None, []) if none."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, AIMessage) and _ANSWER_LINE.search(text_of(message)):
            return None, []
        if message_kind(message) == "input":
            asked = read_questions(text_of(message))
            if asked:
                return index, asked
    return None, []


def stop_requested(messages: Sequence[BaseMessage], since: int) -> bool:
    return any(STOP_LINE in text_of(message) for message in messages[since + 1 :])
