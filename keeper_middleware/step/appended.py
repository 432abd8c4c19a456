"""When a step may start from the window its session's last step ended with, and what a step
leaves for the next one (:mod:`~keeper_middleware.step.tail` holds the facts themselves).

A step that only appends to that window, and is handed back the state that step handed back,
takes each whole-window pass from what the last step found. Whether it may is decided before it
changes anything (:meth:`Tails.take`); whether the window a step ends with can stand for the
next step's walk is decided when it ends (:meth:`Tails.left`). Both say no whenever a full step
would do more than append: a forged tag, a tool call without its result, a head still filling,
NOTES not right after the head, kept messages the NOTES no longer count, a state changed.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import BaseMessage, SystemMessage

from keeper_middleware.messages.facts import close_unanswered_calls
from keeper_middleware.messages.marks import verified
from keeper_middleware.reinjection.questions import QuestionDetector
from keeper_middleware.sessions.branches import HEAD_KEY
from keeper_middleware.sessions.json_copy import json_copy
from keeper_middleware.step.cut import KEPT_KEY, Layout
from keeper_middleware.step.entries import ids_of, messages_of
from keeper_middleware.step.handed_back import as_left
from keeper_middleware.step.known import KnownEntries, LastEntries, Tail
from keeper_middleware.step.result import Pending
from keeper_middleware.step.tail import WindowFacts, appendable, state_copy
from keeper_middleware.step.window import WindowPolicy
from keeper_middleware.tokens.counting import ADDITIVE_COUNTERS

__all__ = ["Tails"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Tails:
    """One keeper's decisions about starting a step from its session's last window."""

    window: WindowPolicy
    detector: QuestionDetector
    pinned_head: int
    secret: Callable[[str], str]
    """The session's secret, which marks the keeper's own messages as genuine."""
    last: LastEntries

    def take(
        self, session: str, given: Sequence[BaseMessage], state: Mapping[str, Any] | None
    ) -> tuple[KnownEntries, Tail] | None:
        """The last window's entries and facts, taken out for this step, when ``given`` is
        that window with messages appended that change nothing a full step would change
        besides appending them, and ``state`` equals the state that step handed back."""
        if type(self.window.tokens) not in ADDITIVE_COUNTERS:
            return None  # the request's size is counted whole, not added up

        def fits(known: KnownEntries, tail: Tail, added: Sequence[BaseMessage]) -> bool:
            kept = tail.state.get(KEPT_KEY)
            if not appendable(added, tail.ids, kept, len(known.messages)):
                return False
            return not kept or _kept_follow(known.messages, tail.facts.layout, kept)

        return self.last.appended(session, given, state, fits)

    def left(
        self, pending: Pending, messages: list[BaseMessage], state: dict[str, Any]
    ) -> Tail | None:
        """What the next step starts from when it only appends to ``messages`` (the window
        this step ends with, sent as it is); None when that cannot stand for walking it (the
        window was changed on the way, or holds what a full step would change)."""
        if pending.plan is not None or HEAD_KEY not in state:
            return None
        facts, appending = pending.facts, pending.appending
        if facts is not None and appending is not None and appending.whole:
            # taken in as the last step left it, unless changed since
            return None if pending.replaced else Tail(facts, state_copy(state), appending.ids)
        entries = pending.entries
        if len(entries) != len(messages) or not all(
            map(operator.is_, messages_of(entries), messages)
        ):
            return None
        ids = set(ids_of(messages))
        seen = state.get("seen")
        items = state.get("items", {})
        if (
            len(ids) != len(messages)
            or not isinstance(seen, list)
            or len(seen) != len(ids)
            or ids != set(seen)
            or not isinstance(items, dict)
            or not items.keys() <= ids
        ):
            return None
        layout = self.window.layout(messages)
        session = pending.session
        if (
            not _head_closed(messages, layout, self.pinned_head)
            or not as_left(messages, pinned_head=self.pinned_head)
            or verified(messages, lambda: self.secret(session))[1]
            or close_unanswered_calls(messages)[1]
        ):
            return None
        return Tail(WindowFacts.of(entries, layout, self.detector), json_copy(state), ids)


def _head_closed(messages: Sequence[BaseMessage], layout: Layout, pinned_head: int) -> bool:
    """Whether messages appended to ``messages`` leave the head where it is: it ends before
    the last message, or holds every pinned input it can."""
    system = 1 if messages and isinstance(messages[0], SystemMessage) else 0
    return layout.head_end < len(messages) or layout.head_end - system >= pinned_head


def _kept_follow(messages: Sequence[BaseMessage], layout: Layout, kept: Sequence[str]) -> bool:
    """Whether the kept messages a cut left after the NOTES still follow it, all within
    ``messages`` (then ``recount_kept`` leaves the window as it is)."""
    at = layout.notes_index
    if at is None:
        return True
    end = at + 1 + len(kept)
    return end <= len(messages) and [str(m.id) for m in messages[at + 1 : end]] == list(kept)
