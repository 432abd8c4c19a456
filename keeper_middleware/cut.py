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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from langchain_core.messages import AIMessage, BaseMessage, SystemMessage, ToolMessage

from keeper_middleware.messages import is_input, keeper_kind, safe_boundary


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


def find_layout(messages: Sequence[BaseMessage], *, pinned_head: int, kept: int) -> Layout:
    """Locate the head and the NOTES message (``kept`` comes from the NOTES' own last line)."""
    index = 1 if messages and isinstance(messages[0], SystemMessage) else 0
    pinned = 0
    while index < len(messages) and pinned < pinned_head and is_input(messages[index]):
        index += 1
        pinned += 1
    notes_index = next(
        (i for i in range(len(messages)) if keeper_kind(messages[i]) == "notes"), None
    )
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
    """Keep an open question (and the keeper's messages right after it) in view across a cut
    that has to pass it because the work on it no longer fits: the question never leaves."""
    if open_question >= plan.keep_from:
        return plan
    pinned = [open_question]
    index = open_question + 1
    while index < plan.keep_from and keeper_kind(messages[index]) is not None:
        pinned.append(index)
        index += 1
    return replace(plan, pinned=tuple(pinned))


def cut_key(session: str, message_ids: Sequence[str], boundary_id: str) -> str:
    """A stable name for one cut, so a cut committed before a crash is recognised on retry."""
    digest = hashlib.sha256(session.encode())
    for msg_id in message_ids:
        digest.update(b"\0" + msg_id.encode())
    digest.update(b"\1" + boundary_id.encode())
    return digest.hexdigest()[:32]
