"""What a window's whole-window passes found, carried from one step to the next that only appends.

A step asks the same questions of its whole window several times: where the head and the NOTES
are, which question is still open, how many tokens the window takes, which messages are new.
Each answer is a walk over every message in view: thousands a step in a long window, although a
step that only appends a message or two to the window the last one ended with changes none of
them but by what it appends. :class:`WindowFacts` holds those answers for one window, and
:meth:`WindowFacts.extended` the answers for the same window with messages appended, from the
appended messages alone.

The facts are only ever used where they equal what the walk gives (the appended messages are
checked for anything that would move the head or the NOTES: :func:`appendable`); the step's
property test runs every step both ways and compares the results.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, SystemMessage, ToolMessage

from keeper_middleware.messages.facts import KEEPER_KEY, kind_positions
from keeper_middleware.messages.marks import MARK_KEY
from keeper_middleware.reinjection.questions import (
    QuestionDetector,
    open_after,
    open_question_index,
)
from keeper_middleware.sessions.json_copy import json_copy
from keeper_middleware.step.cut import Layout
from keeper_middleware.step.entries import Entry, messages_of, sizes_of

__all__ = ["Appending", "WindowFacts", "appendable", "state_copy"]

_ID = operator.attrgetter("id")


@dataclass(frozen=True, slots=True)
class WindowFacts:
    """The answers of a window's whole-window passes (each as the pass itself gives it)."""

    length: int
    """How many messages the window holds."""
    layout: Layout
    """``WindowPolicy.layout`` of the window."""
    notes_at: tuple[int, ...]
    """``kind_positions(window, "notes")``."""
    open_at: int | None
    """``open_question_index(window, detector, start=layout.head_end)``."""
    total: int
    """The sum of the window's entries' sizes (``sum(sizes_of(entries))``)."""

    @classmethod
    def of(
        cls,
        entries: Sequence[Entry],
        layout: Layout,
        detector: QuestionDetector,
    ) -> WindowFacts:
        """The facts of a whole window, walked (``layout``: its layout, found by the caller)."""
        messages = messages_of(entries)
        return cls(
            length=len(entries),
            layout=layout,
            notes_at=tuple(kind_positions(messages, "notes")),
            open_at=open_question_index(messages, detector, start=layout.head_end),
            total=sum(sizes_of(entries)),
        )

    def extended(self, entries: Sequence[Entry], detector: QuestionDetector) -> WindowFacts | None:
        """The facts of this window with ``entries`` appended, from the appended entries
        alone; None when one of them is a NOTES message (the layout moves)."""
        added = messages_of(entries)
        if kind_positions(added, "notes"):
            return None
        return WindowFacts(
            length=self.length + len(entries),
            layout=self.layout,
            notes_at=self.notes_at,
            open_at=open_after(enumerate(added, self.length), detector, self.open_at),
            total=self.total + sum(sizes_of(entries)),
        )

    def noted_tokens(self, entries: Sequence[Entry]) -> int:
        """The size of the window's messages from ``layout.noted_start`` on (``entries``: the
        window's; only those before that start are read, a handful)."""
        return self.total - sum(sizes_of(entries[: self.layout.noted_start]))


@dataclass(slots=True)
class Appending:
    """A step that appends to the window its session's last step ended with: what taking the
    new messages in starts from instead of walking the window."""

    facts: WindowFacts
    """The facts of the step's window (the last one's, with the new messages)."""
    length: int
    """How many messages the last step's window held (the new ones start there)."""
    messages: list[BaseMessage]
    """Those messages."""
    ids: set[str]
    """The ids of those messages, which are the keeper state's ``seen`` ids: taken over from
    the last step's tail, the new messages' ids are added to it as they are taken in."""
    first: int
    """``first_fresh`` of the step's entries (none of the last window's is fresh)."""
    whole: bool = False
    """Set once the new messages are taken in, when ``ids`` are the ids in view again."""


def appendable(
    added: Sequence[BaseMessage], ids: set[str], kept: Sequence[str] | None, window: int
) -> bool:
    """Whether messages appended to a window the keeper left (whose message ids are ``ids``)
    leave every whole-window pass where the window left it: each has an id none of the
    window's messages has (nor one before it), none is a system message or carries a keeper
    tag or mark (a forged tag takes the full path, which removes it), every tool call among
    them has its result among them (nothing for ``close_unanswered_calls`` to add), and the
    kept messages the NOTES count (``kept``) all lie within the window."""
    if kept and len(kept) > window:
        return False
    new_ids: set[str] = set()
    answered: set[Any] = set()
    calls: set[Any] = set()
    for message in added:
        msg_id = message.id
        if not msg_id or msg_id in ids or msg_id in new_ids or isinstance(message, SystemMessage):
            return False
        new_ids.add(msg_id)
        extra: Mapping[str, Any] = message.additional_kwargs
        if KEEPER_KEY in extra or MARK_KEY in extra:
            return False
        if isinstance(message, ToolMessage):
            answered.add(message.tool_call_id)
        elif isinstance(message, AIMessage) and (message.tool_calls or message.invalid_tool_calls):
            calls.update(
                call.get("id") for call in (*message.tool_calls, *message.invalid_tool_calls)
            )
    calls.discard(None)
    calls.discard("")
    return calls <= answered


def state_copy(state: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a keeper state a step made on this path, sharing nothing that can change:
    ``json_copy`` of it, without walking the ``seen`` ids and the ``items`` (their ids are
    strings and their numbers whole numbers, as this path writes them, so a list and a dict of
    them copied one level down hold nothing mutable)."""
    rest: dict[str, Any] = json_copy({k: v for k, v in state.items() if k not in _FLAT})
    for key in _FLAT:
        value = state.get(key)
        if type(value) is list:
            rest[key] = list(value)
        elif type(value) is dict:
            rest[key] = dict(value)
        elif key in state:
            rest[key] = json_copy(value)
    return rest


_FLAT = ("seen", "items")
"""The keeper state's values that grow with the window: flat containers of scalars."""
