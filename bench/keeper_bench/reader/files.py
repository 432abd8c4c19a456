"""Reading back a history file the context points to, with the file tools the model is offered.

Some harnesses move what leaves the window into a file and tell the model where it is (Deep
Agents: "The full conversation history has been saved to /conversation_history/<id>.md ...").
A model offered file tools can read it back; this is the reader's skill for it, the counterpart
of its archive search, and no arm's in particular: it acts for any request that offers
``grep`` and ``read_file`` and whose context names a file that history was saved to.

For each fact a question lacks (the same gaps the archive search is planned from), the reader
greps the file for the name asked about, then reads the lines around each match, newest match
first, a few lines a call, up to the batch head above it ("Item N.") and the end of its batch:
a whole batch read from the file counts as a batch in view (every change of its item seen), and
a name whose matches have all been read, from some batch on, is known from there to the end.
The file holds the conversation as Deep Agents writes it (``get_buffer_string(format="xml")``:
each message between ``<message type="...">`` and ``</message>``); only human messages that
open with a batch head are story.

Everything here is pure: messages in, what the file showed and the next calls out.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from keeper_bench.reader.text import BATCH_HEAD_WORD
from keeper_middleware.messages.facts import text_of

FILE_READ_TOOL = "read_file"
FILE_GREP_TOOL = "grep"
FILE_TOOLS = frozenset({FILE_READ_TOOL, FILE_GREP_TOOL})
READ_STEP = 4
"""Lines a read takes above a match (or past what was read): few, since what is read stays in
the window (a small-stream batch is 2 lines, a 240K one 12-17)."""
FILE_CALLS_PER_REPLY = 1
"""File calls go one at a time: Deep Agents keeps a reply's tool results together when it
compacts, and four greps' results at once outgrew a 6,144-token window (its compaction then
raises ContextOverflowError and the run stops)."""
_POINTER = re.compile(r"\b(?:saved|offloaded|written) to (/\S+)")
_GREP_LINE = re.compile(r"^\s+(\d+): (.*)$")
_READ_HEADER = re.compile(r"^@@ lines (\d+)-(\d+)")
_OPENER = re.compile(r'^\s*<message type="(\w+)">(.*)$')
_CLOSER = "</message>"
_HEAD = re.compile(rf"^({BATCH_HEAD_WORD}) (\d+)\.\s*$")
FileCommand = tuple[str, dict[str, Any]]


def offers_files(tools: frozenset[str]) -> bool:
    """True when the request offers the tools the file-reading skill uses."""
    return tools >= FILE_TOOLS


def history_pointer(messages: Sequence[BaseMessage]) -> str | None:
    """The last file the context says history was saved (or offloaded, written) to."""
    for message in reversed(messages):
        if isinstance(message, AIMessage | ToolMessage):
            continue
        found = _POINTER.findall(text_of(message))
        if found:
            return str(found[-1]).rstrip(".,;:)")
    return None


@dataclass(frozen=True, slots=True)
class FileCall:
    """One call to a file tool in the context, and its result (None: not answered yet)."""

    tool: str
    args: Mapping[str, Any]
    result: str | None
    message_index: int

    @property
    def key(self) -> str:
        return command_key((self.tool, dict(self.args)))


def command_key(command: FileCommand) -> str:
    return json.dumps([command[0], command[1]], sort_keys=True, default=str)


def file_calls(messages: Sequence[BaseMessage]) -> list[FileCall]:
    """The calls to the file tools sent in these messages and what each got back."""
    answers = {m.tool_call_id: text_of(m) for m in messages if isinstance(m, ToolMessage)}
    calls: list[FileCall] = []
    for index, message in enumerate(messages):
        if isinstance(message, AIMessage):
            for call in message.tool_calls:
                if call["name"] in FILE_TOOLS:
                    result = answers.get(call.get("id") or "")
                    calls.append(FileCall(call["name"], dict(call["args"]), result, index))
    return calls


@dataclass(slots=True)
class _Batch:
    item: int
    head: int
    texts: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class FileBatch:
    """A whole batch read from the file: its item and text ("Item N." and its lines)."""

    item: int
    text: str
    message_index: int
    """The last message that showed a line of it."""


@dataclass(frozen=True, slots=True)
class FileView:
    """What the reader has seen of the history file in this context."""

    path: str | None = None
    matches: Mapping[str, tuple[tuple[int, ...], bool]] = field(default_factory=dict)
    """Grep pattern -> (the lines it matched, whether the list is complete)."""
    lines: Mapping[int, str] = field(default_factory=dict)
    """Line number -> text, of every line read."""
    placed: Mapping[int, int | None] = field(default_factory=dict)
    """Line number -> the item of the whole batch it is in, or None outside any batch (another
    message, a section head); lines not yet placed are left out."""
    open_at: Mapping[int, str] = field(default_factory=dict)
    """Line number -> "up" (its batch head is above what was read) or "down" (its batch goes on
    below what was read), for lines read but not placed."""
    batches: tuple[FileBatch, ...] = ()
    calls: tuple[FileCall, ...] = ()


EMPTY_FILE_VIEW = FileView()


def read_file_view(messages: Sequence[BaseMessage]) -> FileView:
    """What the grep and read_file results in ``messages`` show of the file they point to."""
    path = history_pointer(messages)
    calls = tuple(file_calls(messages))
    if path is None and not calls:
        return EMPTY_FILE_VIEW
    matches: dict[str, tuple[tuple[int, ...], bool]] = {}
    lines: dict[int, str] = {}
    shown_by: dict[int, int] = {}
    for call in calls:
        if call.result is None:
            continue
        if call.tool == FILE_GREP_TOOL:
            matches[str(call.args.get("pattern", ""))] = _grep_lines(call.result)
        else:
            for number, text in _read_lines(call.result):
                lines[number] = text
                shown_by[number] = call.message_index
    placed, open_at, found = _place(lines)
    batches = tuple(
        FileBatch(
            batch.item,
            "\n".join(batch.texts),
            max(shown_by[n] for n in range(batch.head, batch.head + len(batch.texts))),
        )
        for batch in found
    )
    return FileView(path, matches, lines, placed, open_at, batches, calls)


def _grep_lines(result: str) -> tuple[tuple[int, ...], bool]:
    """The line numbers a content-mode grep result lists, and whether it is the whole list (it
    lists lines or says there are none, and says nothing was left out)."""
    numbers: list[int] = []
    complete = result.strip().startswith("No matches")
    for line in result.splitlines():
        match = _GREP_LINE.match(line)
        if match is not None:
            complete = True
            if _is_story_line(match.group(2)):
                numbers.append(int(match.group(1)))
    if "truncated" in result or "incomplete" in result:
        complete = False
    return tuple(sorted(set(numbers))), complete


def _is_story_line(text: str) -> bool:
    """Whether a matched line can be story: not a question, a tool call or another message's
    opening line (a reader sees as much in the grep line itself)."""
    line = text.strip().removesuffix(_CLOSER)
    if line.endswith("?") or "<tool_call" in line:
        return False
    opener = _OPENER.match(line)
    return opener is None or opener.group(1) == "human"


def _read_lines(result: str) -> list[tuple[int, str]]:
    """(line number, text) of a read_file result: its lines under the "@@ lines A-B @@" head."""
    rows = result.split("\n")
    for index, row in enumerate(rows):
        header = _READ_HEADER.match(row)
        if header is not None:
            first, last = int(header.group(1)), int(header.group(2))
            body = rows[index + 1 : index + 1 + last - first + 1]
            return [(first + offset, text) for offset, text in enumerate(body)]
    return []


def _place(
    lines: Mapping[int, str],
) -> tuple[dict[int, int | None], dict[int, str], list[_Batch]]:
    """Which batch each read line belongs to, walking each run of consecutive lines read."""
    placed: dict[int, int | None] = {}
    open_at: dict[int, str] = {}
    batches: list[_Batch] = []
    numbers = sorted(lines)
    start = 0
    while start < len(numbers):
        end = start
        while end + 1 < len(numbers) and numbers[end + 1] == numbers[end] + 1:
            end += 1
        _place_run([(n, lines[n]) for n in numbers[start : end + 1]], placed, open_at, batches)
        start = end + 1
    return placed, open_at, batches


def _place_run(
    run: Sequence[tuple[int, str]],
    placed: dict[int, int | None],
    open_at: dict[int, str],
    batches: list[_Batch],
) -> None:
    """Place one run of consecutive lines: a batch runs from its head to its closing tag, or to
    the next message or section (its last sentence, closing tag and all, may be overlooked)."""
    state: _Batch | str = "unknown"
    waiting: list[int] = []

    def close(batch: _Batch) -> None:
        batches.append(batch)
        placed.update(dict.fromkeys(waiting, batch.item))

    for number, text in run:
        opener = _OPENER.match(text)
        boundary = opener is not None or not text.strip() or text.startswith("## ")
        if isinstance(state, _Batch) and boundary:
            close(state)
            state, waiting = "outside", []
        head = None if opener is None else _HEAD.match(opener.group(2).strip())
        if opener is not None and opener.group(1) == "human" and head is not None:
            state = _Batch(int(head.group(2)), number, [f"{head.group(1)} {head.group(2)}."])
            waiting = [number]
        elif boundary:
            state = "outside"
        elif isinstance(state, _Batch):
            state.texts.append(text.rstrip().removesuffix(_CLOSER))
            waiting.append(number)
        if isinstance(state, _Batch):
            if text.rstrip().endswith(_CLOSER):
                close(state)
                state, waiting = "outside", []
        elif state == "outside":
            placed[number] = None
        else:  # the run began inside a message whose opening line was not read
            open_at[number] = "up"
            if text.rstrip().endswith(_CLOSER):
                state = "outside"
    if isinstance(state, _Batch):
        open_at.update(dict.fromkeys(waiting, "down"))


def file_coverage(view: FileView, latest: int) -> list[tuple[str, int, int]]:
    """(name, first item, last item): where every mention of a name grepped for is known.

    A complete grep whose matches have all been placed covers the whole story; otherwise the
    newest matches placed, down to the first one not yet read, cover from their earliest batch
    on (the file is written in story order)."""
    covered: list[tuple[str, int, int]] = []
    for pattern, (numbers, complete) in view.matches.items():
        if not complete:
            continue
        lowest: int | None = None
        whole = True
        for number in sorted(numbers, reverse=True):
            if number not in view.placed:
                whole = False
                break
            item = view.placed[number]
            if item is not None:
                lowest = item
        if whole:
            covered.append((pattern, 1, latest))
        elif lowest is not None:
            covered.append((pattern, lowest, latest))
    return covered


def next_file_command(view: FileView, name: str) -> FileCommand | None:
    """The call that adds most to what the file shows of ``name``: grep for it, else read
    towards the batch of its newest match not yet placed."""
    path = view.path
    if path is None:
        return None
    if name not in view.matches:
        return (FILE_GREP_TOOL, {"pattern": name, "path": path, "output_mode": "content"})
    for number in sorted(view.matches[name][0], reverse=True):
        if number in view.placed:
            continue
        direction = view.open_at.get(number)
        if direction is None:  # not read: the lines above it, and the next one
            first = max(1, number - READ_STEP + 1)
            return _read(path, first, number + 1)
        run_start, run_end = _run_around(view.lines, number)
        if direction == "up":
            if run_start <= 1:
                continue
            return _read(path, max(1, run_start - READ_STEP), run_start - 1)
        return _read(path, run_end + 1, run_end + READ_STEP)
    return None


def _read(path: str, first: int, last: int) -> FileCommand:
    """read_file of lines ``first``-``last`` (1-based; its offset counts from 0)."""
    return (FILE_READ_TOOL, {"file_path": path, "offset": first - 1, "limit": last - first + 1})


def _run_around(lines: Mapping[int, str], number: int) -> tuple[int, int]:
    start = end = number
    while start - 1 in lines:
        start -= 1
    while end + 1 in lines:
        end += 1
    return start, end


def circle_commands(view: FileView, name: str) -> list[FileCommand]:
    """The three calls a reader going round in circles sends in turn (the ``circle_searches``
    fault): one grep for ``name``, asked three ways."""
    path = view.path or "/"
    return [
        (FILE_GREP_TOOL, {"pattern": name, "path": path, "output_mode": "content"}),
        (FILE_GREP_TOOL, {"pattern": name, "path": posixpath.dirname(path) or "/"}),
        (FILE_GREP_TOOL, {"pattern": name, "path": path, "output_mode": "count"}),
    ]


def last_answered(messages: Sequence[BaseMessage]) -> FileCommand | None:
    """The file call whose result is the last message (for the ``repeat_search`` fault)."""
    if not messages or not isinstance(messages[-1], ToolMessage):
        return None
    last = messages[-1]
    for message in reversed(messages):
        if isinstance(message, AIMessage):
            for call in message.tool_calls:
                if call.get("id") == last.tool_call_id and call["name"] in FILE_TOOLS:
                    return (call["name"], dict(call["args"]))
    return None
