"""Choosing what a cut notes, archives and keeps in view (pure).

A conversation in view looks like this (indices into the stored messages)::

    [system?] [task ...] [NOTES] [kept, already noted ...] [new turns ...] [open question ...]
    0         ^head_end  ^notes  ^                         ^noted_start     ^boundary

The cut notes ``[noted_start, boundary)``, archives everything that leaves the window, and keeps
the newest exchange (so an agent still sees what it just fetched, labelled as already noted) and
everything from the earliest open question on (an open question never leaves the window).
"""

from __future__ import annotations

import hashlib
import json
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from langchain_core.messages import AIMessage, BaseMessage, SystemMessage, ToolMessage

from keeper_middleware.messages.facts import (
    first_of_kind,
    is_input,
    keeper_kind,
    safe_boundary,
    text_of,
)
from keeper_middleware.notes.block import parse_notes, render_notes

_ID = operator.attrgetter("id")
KEPT_KEY = "kept"
"""Where the keeper state lists the ids of the messages a cut kept in view as already noted."""


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the fixed parts of a conversation in view are."""

    head_end: int
    """Index after the system message (if stored) and the pinned task messages."""
    notes_index: int | None
    """Index of the NOTES message, if there is one."""
    kept: int
    """How many messages after the NOTES were kept from before it (already noted)."""

    @property
    def noted_start(self) -> int:
        """First message not yet accounted for by the NOTES."""
        if self.notes_index is None:
            return self.head_end
        return self.notes_index + 1 + self.kept


def find_layout(
    messages: Sequence[BaseMessage],
    *,
    pinned_head: int,
    kept: int,
    notes_index: int | Literal["find"] | None = "find",
) -> Layout:
    """Locate the head and the NOTES message (``kept`` comes from the NOTES' own last line;
    ``notes_index``: where the first NOTES message is, when the caller has found it already)."""
    index = 1 if messages and isinstance(messages[0], SystemMessage) else 0
    pinned = 0
    while index < len(messages) and pinned < pinned_head and is_input(messages[index]):
        index += 1
        pinned += 1
    if notes_index == "find":
        notes_index = first_of_kind(messages, "notes")
    head_end = min(index, notes_index) if notes_index is not None else index
    return Layout(
        head_end=head_end, notes_index=notes_index, kept=kept if notes_index is not None else 0
    )


@dataclass(frozen=True, slots=True)
class CutPlan:
    """One cut, decided; nothing has been written yet."""

    layout: Layout
    boundary: int
    """Notes cover ``[layout.noted_start, boundary)``; the note request follows ``boundary - 1``."""
    keep_from: int
    """Messages ``[keep_from, boundary)`` stay in view as already noted; ``[boundary:]`` stay too."""
    pinned: tuple[int, ...] = ()
    """Earlier messages that stay in view although the cut passes them: an open question (and
    what the keeper placed beside it) whose own work has outgrown the window."""

    @property
    def noted(self) -> range:
        return range(self.layout.noted_start, self.boundary)

    @property
    def leaving(self) -> list[int]:
        """Indices of the messages that leave the window (after the head)."""
        return [i for i in range(self.layout.head_end, self.keep_from) if i not in self.pinned]

    @property
    def kept_count(self) -> int:
        return len(self.pinned) + self.boundary - self.keep_from


def newest_exchange_start(messages: Sequence[BaseMessage], boundary: int, floor: int) -> int:
    """Where the newest exchange before ``boundary`` begins (never before ``floor``).

    After tool results: the AI message that asked for them. After new input: that input (and
    anything the keeper placed beside it). After a final reply: nothing is kept.
    """
    index = boundary
    if index <= floor:
        return floor
    last = messages[index - 1]
    if isinstance(last, ToolMessage):
        while index > floor and isinstance(messages[index - 1], ToolMessage):
            index -= 1
        if index > floor and isinstance(messages[index - 1], AIMessage):
            index -= 1
        return max(index, floor)
    if isinstance(last, AIMessage):
        return boundary
    while index > floor and not isinstance(messages[index - 1], AIMessage | ToolMessage):
        index -= 1
    return max(index, floor)


def plan_cut(
    messages: Sequence[BaseMessage],
    layout: Layout,
    *,
    open_question: int | None,
    notes_call_fits: Callable[[int], bool],
) -> CutPlan | None:
    """Decide a cut, or None when there is nothing new to note.

    ``notes_call_fits(b)`` says whether a note request appended after ``messages[:b]`` fits the
    window; the boundary is the largest such ``b`` that splits no tool call from its results and
    does not pass the earliest open question.
    """
    start = layout.noted_start
    limit = len(messages) if open_question is None else max(open_question, start)
    boundary = safe_boundary(messages, limit)
    if not notes_call_fits(boundary):
        low, high = start, boundary
        while low < high:  # largest b in [start, boundary] that fits
            middle = (low + high + 1) // 2
            if notes_call_fits(middle):
                low = middle
            else:
                high = middle - 1
        boundary = safe_boundary(messages, low)
    if boundary <= start:
        return None
    floor = start
    keep_from = newest_exchange_start(messages, boundary, floor)
    if keep_from <= layout.head_end:
        keep_from = boundary
    return CutPlan(layout=layout, boundary=boundary, keep_from=keep_from)


def pin_open_question(
    messages: Sequence[BaseMessage], plan: CutPlan, open_question: int
) -> CutPlan:
    """Keep an open question (and the RULES the keeper placed right after it) in view across a
    cut that has to pass it because the work on it no longer fits: the question never leaves.

    Retrieved passages placed beside it are not pinned: they are archived text shown again,
    and they leave before the question's own work does (they never crowd it out)."""
    if open_question >= plan.keep_from:
        return plan
    pinned = [open_question]
    index = open_question + 1
    while index < plan.keep_from and keeper_kind(messages[index]) is not None:
        if keeper_kind(messages[index]) != "retrieved":
            pinned.append(index)
        index += 1
    return replace(plan, pinned=tuple(pinned))


def work_start(messages: Sequence[BaseMessage], plan: CutPlan) -> int:
    """Where the work on a pinned open question begins: after the question and every message
    the keeper placed beside it (``plan.keep_from`` when the plan pins nothing)."""
    if not plan.pinned:
        return plan.keep_from
    index = plan.pinned[0] + 1
    while index < plan.keep_from and keeper_kind(messages[index]) is not None:
        index += 1
    return index


def recount_kept(
    messages: Sequence[BaseMessage], kept_ids: Sequence[str] | None
) -> tuple[list[BaseMessage], list[str] | None, bool]:
    """The messages with the NOTES' count of kept messages lowered to the kept messages still in
    view, the ids still kept (None: all of them) and whether the NOTES message was re-rendered.

    A cut keeps the newest exchange in view and says in the NOTES how many messages after them
    are already noted. A graph can remove some of them afterwards (``RemoveMessage``): counted
    by position, the messages that moved up into their places would pass as noted and never be
    noted. The NOTES message keeps its id and mark (the mark covers kind and id, not text)."""
    result = list(messages)
    if not kept_ids:
        return result, None, False
    at = first_of_kind(result, "notes")
    if at is None:
        return result, None, False
    following = [str(m.id) for m in result[at + 1 : at + 1 + len(kept_ids)]]
    if following == list(kept_ids):
        return result, None, False
    known = set(kept_ids)
    still: list[str] = []
    for message in result[at + 1 :]:
        if str(message.id) not in known:
            break
        still.append(str(message.id))
    notes, kept = parse_notes(text_of(result[at]))
    if len(still) >= kept:
        return result, still, False
    text = render_notes(notes, kept=len(still))
    result[at] = result[at].model_copy(update={"content": text})
    return result, still, True


def cut_key(session: str, parent: str | None, messages: Sequence[BaseMessage]) -> str:
    """A stable name for one cut: the session, the cut before it on its branch, and every
    message up to the cut's boundary (what it notes, archives or keeps), each by id and content.

    A cut committed before a crash is recognised on retry, and the same cut replayed from the
    same checkpoint is the same cut (its NOTES are reused, not asked for again); a cut over an
    edited message, or after another parent, is another cut. The keeper's own messages count by
    id only (the proxy may re-render the NOTES' kept count in place)."""
    parts = [session, "\x02", parent or ""]
    for message in messages:
        parts.append("\x00" + str(message.id))
        if keeper_kind(message) is None:
            parts.append("\x03" + message.type + "\x1f" + text_of(message))
            calls = message.tool_calls if isinstance(message, AIMessage) else None
            if calls:
                parts.append(json.dumps(calls, ensure_ascii=False, sort_keys=True, default=str))
            answered = message.tool_call_id if isinstance(message, ToolMessage) else None
            if answered or message.name:
                parts.append(f"\x1f{answered or ''}\x1f{message.name or ''}")
    joined = "\x1e".join(parts).encode("utf-8", "surrogatepass")
    return hashlib.sha256(joined).hexdigest()[:32]


def whole_key(session: str, parent: str | None, msg_id: str, digest: str) -> str:
    """The name of the commit that archives one message whole as it arrives (an excerpt stands
    in view): the same message on the same branch is the same commit."""
    name = hashlib.sha256(
        "\0".join((session, parent or "", msg_id, digest)).encode("utf-8", "surrogatepass")
    )
    return "whole-" + name.hexdigest()[:32]


def uncount_removed(
    kstate: dict[str, Any], messages: Sequence[BaseMessage], count_key: str
) -> None:
    """Take the inputs a graph removed before any cut noted them (``RemoveMessage``) out of
    the count of items since the last cut (``count_key``), so the next cut comes where it
    would on a thread that never saw them. Kept messages were noted, and not counted."""
    count = kstate.get(count_key)
    items: dict[str, int] = kstate.get("items", {})
    if count is None or not items:
        return
    live = set(map(str, map(_ID, messages)))
    if items.keys() <= live:  # nothing removed (each step's usual case)
        return
    kept = set(kstate.get(KEPT_KEY) or ())
    removed = {n for i, n in items.items() if i not in live and i not in kept}
    removed -= {n for i, n in items.items() if i in live}
    if removed:
        kstate[count_key] = max(0, int(count) - len(removed))
        kstate["items"] = {i: n for i, n in items.items() if i in live}
