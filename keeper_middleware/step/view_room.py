"""The room each message gets in view (a mixin of
:class:`~keeper_middleware.step.window.WindowPolicy`; pure).

What in view is shrunk first, how far: the excerpt floor below which a message is not cut down,
each new message's cap (its share of the room, never below the floor), the folded and smallest
forms a unit can take, and the error when what must stay in view cannot fit.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from langchain_core.messages import BaseMessage, SystemMessage

from keeper_middleware.config import KeeperConfig
from keeper_middleware.errors import WindowTooSmallError
from keeper_middleware.model.setup import ModelSetup
from keeper_middleware.notes.block import Notes
from keeper_middleware.reinjection.questions import QuestionDetector, open_question_index
from keeper_middleware.step.cut import (
    Layout,
)
from keeper_middleware.step.entries import Entry, first_fresh, messages_of
from keeper_middleware.step.excerpts import (
    MIN_EXCERPT_TOKENS,
    excerpt_ref,
    pointer_cost,
    smallest_form,
)
from keeper_middleware.step.fold import foldable, folded_pair, reply_stub, round_ref
from keeper_middleware.step.room import units, water_level, water_level_above
from keeper_middleware.step.tail import WindowFacts
from keeper_middleware.tokens.counting import TokenCounter

__all__ = ["Excerpt", "ViewRoom", "listed_parts"]

_ENTRY_ID: Callable[[Entry], str] = operator.attrgetter("id")
_FLOORS_KEPT = 4096
"""Sessions whose excerpt floor is kept at once (all are dropped when more come)."""


Excerpt = Callable[[BaseMessage, int], BaseMessage]
"""Archive a message whole and return its excerpt within a cap (the engine's I/O)."""


class ViewRoom:
    """The room decisions of a window policy (mixed into ``WindowPolicy``, a frozen dataclass
    that holds the configuration, the counter and the caches named here)."""

    __slots__ = ()

    config: KeeperConfig
    tokens: TokenCounter
    detector: QuestionDetector
    _floors: dict[str, int]

    if TYPE_CHECKING:

        def count(self, setup: ModelSetup, messages: Sequence[BaseMessage]) -> int: ...

        def layout(self, messages: Sequence[BaseMessage]) -> Layout: ...

        def fixed_parts(
            self,
            entries: Sequence[Entry],
            setup: ModelSetup,
            seen: set[str] | None = None,
            facts: WindowFacts | None = None,
        ) -> dict[str, int]: ...

        def request_cost(self) -> int: ...

        def beside_cost(self, notes: Notes) -> int: ...

    def excerpt_floor(self, session: str) -> int:
        """The least a new message's cap may be: an excerpt's head and tail and its pointer
        line (whose reference is the session's; worked out once a session, as every step
        asks)."""
        floors = self._floors
        found = floors.get(session)
        if found is None:
            if len(floors) >= _FLOORS_KEPT:
                floors.clear()
            ref = excerpt_ref(session, "x")
            found = floors[session] = MIN_EXCERPT_TOKENS + pointer_cost(ref, self.tokens.count_text)
        return found

    def message_caps(
        self,
        session: str,
        entries: Sequence[Entry],
        seen: set[str],
        setup: ModelSetup,
        notes: Notes,
        *,
        facts: WindowFacts | None = None,
        first: int | None = None,
    ) -> tuple[dict[str, int], int, list[list[Entry]]]:
        """The most each new message may take in view, by id, the room one message has in
        view (what a search result or a page read back may take), and the rounds of tool
        calls to fold (too big even with every message at its smallest: :mod:`.fold`).

        A cut can pass any message but never splits a tool call from its results, so each such
        unit (one message, or a call with its results) must fit a note request beside the fixed
        part: system prompt and tools, the pinned task, the NOTES, the note request and what is
        repeated beside a question. Within a unit the room is shared so that small messages stay
        whole and only the big ones are cut down, none beyond the message limit.
        """
        layout = self.layout(messages_of(entries)) if facts is None else facts.layout
        parts = self.fixed_parts(entries, setup, seen, facts)
        # what was kept in view beside the NOTES is in every note request too, but it is not
        # fixed: when it leaves no room it is excerpted (in_view_excess), never refused
        kept = sum(
            e.tokens
            for e in entries[layout.head_end : layout.noted_start]
            if e.kind != "notes" and not e.fresh(seen)
        )
        beside = self.beside_cost(notes)
        room = self.config.budget - sum(parts.values())
        limit = self.config.message_tokens  # worked out once: a property of a few calls
        floor = self.excerpt_floor(session)
        caps: dict[str, int] = {}
        folds: list[list[Entry]] = []
        for unit in units(entries[_first_unit_with_fresh(entries, seen, first) :]):
            flags = [e.fresh(seen) for e in unit]
            if not any(flags):
                continue
            fresh = list(itertools.compress(unit, flags))
            in_view = sum(e.tokens for e, new in zip(unit, flags, strict=True) if not new)
            besides = beside if any(e.question for e in fresh) else 0
            avail = room - in_view - besides
            sizes = [e.tokens for e in fresh]
            if sum(map(min, sizes, itertools.repeat(floor))) <= avail:
                share = water_level(sizes, avail - kept, limit)
                if share < MIN_EXCERPT_TOKENS and kept:
                    share = water_level(sizes, avail, limit)
                caps.update(zip(map(_ENTRY_ID, fresh), itertools.repeat(max(share, floor))))
                continue
            # a burst (fifty tool results at once, or five hundred): too many for each to keep
            # a head, a tail and a full pointer, so the big ones stand as their smallest form
            smallest = [self.least_tokens(session, e) for e in fresh]
            if sum(smallest) > avail:
                if not foldable(unit, seen):
                    raise self._unit_too_big(parts, in_view, besides, smallest)
                # fifty calls at once in a small window: the round stands as one pointer pair
                pair = self.folded_tokens(session, unit)
                if pair > avail:
                    folded = f"the new round of {len(unit) - 1} tool calls folded to one call"
                    raise self._unit_too_big(parts, in_view, besides, [pair], folded)
                folds.append(unit)
                continue
            level = water_level_above(sizes, smallest, avail, limit)
            caps.update(
                (e.id, max(least, min(size, level)))
                for e, size, least in zip(fresh, sizes, smallest, strict=True)
            )
        return caps, max(MIN_EXCERPT_TOKENS, min(room, limit)), folds

    def folded_tokens(self, session: str, unit: Sequence[Entry]) -> int:
        """What a round folded to its pointer pair takes in view."""
        ref = excerpt_ref(session, unit[0].id)
        pair = folded_pair([e.message for e in unit], round_ref(ref), reply_stub(ref))
        return self.tokens.count_messages(list(pair))

    def least_tokens(self, session: str, entry: Entry) -> int:
        """The least a message can take in view: its :func:`smallest_form` (an excerpt is
        never bigger than what it stands for)."""
        ref = excerpt_ref(session, entry.id)
        smallest = smallest_form(entry.message, ref)
        if smallest is entry.message:
            return entry.tokens
        return min(entry.tokens, self.tokens.count_messages([smallest]))

    def _unit_too_big(
        self,
        parts: Mapping[str, int],
        in_view: int,
        besides: int,
        smallest: Sequence[int],
        label: str | None = None,
    ) -> WindowTooSmallError:
        """The refusal of new input that cannot fit even with every message at its smallest
        (or, for a round of tool calls, folded: ``label``); the parts it lists add up to the
        total it states."""
        label = label or f"the new input at its smallest ({len(smallest)} messages)"
        listed = {
            **parts,
            "the rest of its unit in view": in_view,
            "what stands beside a question": besides,
            label: sum(smallest),
        }
        need = sum(listed.values())
        return WindowTooSmallError(
            f"the fixed part of a request does not fit: {listed_parts(listed)} = {need} tokens, "
            f"over the budget of {self.config.budget} (window {self.config.window} - reply "
            f"reserve {self.config.reserve}) by {need - self.config.budget}. Raise the "
            "window, lower reply_reserve, or shorten the largest part (fewer tool calls at once "
            "make a smaller input)."
        )

    def in_view_excess(self, entries: Sequence[Entry], setup: ModelSetup) -> tuple[list[int], int]:
        """The messages kept in view beside the NOTES and in the first unit not yet noted (a
        message, or a tool call with its results) that must be excerpted for a note request to
        fit after them again, and the cap each gets.

        Used when nothing can be cut: what is in view outgrew the window after the messages
        were taken in (the NOTES or the kept exchange grew, an open question's work piled up).
        """
        messages = messages_of(entries)
        layout = self.layout(messages)
        open_at = open_question_index(messages, self.detector, start=layout.head_end)
        first = layout.head_end if layout.notes_index is None else layout.notes_index + 1
        end = layout.noted_start
        while end < len(entries) and (end == open_at or entries[end].kind is not None):
            end += 1
        end += 1
        while end < len(entries) and entries[end].is_tool_result:
            end += 1
        end = min(end, len(entries))
        # the kept messages and the first unit not yet noted; never the question itself
        shrinkable = [i for i in range(first, end) if i != open_at and entries[i].kind is None]
        if not shrinkable:
            return [], 0
        fixed = [m for i, m in enumerate(messages[:end]) if i not in shrinkable]
        room = self.config.budget - self.request_cost() - self.count(setup, fixed)
        sizes = [entries[i].tokens for i in shrinkable]
        level = water_level(sizes, room, self.config.message_tokens)
        over = [i for i, size in zip(shrinkable, sizes, strict=True) if size > level]
        return over, level

    def shrink_largest(
        self,
        entries: Sequence[Entry],
        setup: ModelSetup,
        excerpt: Excerpt,
        *,
        start: int,
        target: int | None = None,
    ) -> list[BaseMessage]:
        """Excerpt the biggest messages from ``start`` on (not the keeper's own) until the
        request fits ``target`` (default: room for a note request within the budget);
        ``excerpt`` archives each whole first.

        The request is counted once; each excerpt then takes off what it saved (recounting the
        whole window after each message made this quadratic in the messages)."""
        if target is None:
            target = self.config.budget - self.request_cost()
        result = messages_of(entries)
        sizes = {
            i: e.tokens
            for i, e in enumerate(entries)
            if i >= start and e.kind is None and not e.is_system
        }
        total = self.count(setup, result)
        for index in sorted(sizes, key=lambda i: -sizes[i]):
            excess = total - target
            if excess <= 0:
                break
            cap = max(MIN_EXCERPT_TOKENS, sizes[index] - excess)
            result[index] = excerpt(result[index], cap)
            if result[index] is not entries[index].message:
                total += self.tokens.count_messages([result[index]]) - sizes[index]
        return result

    def too_big_error(
        self, request_tokens: int, entries: Sequence[Entry], setup: ModelSetup
    ) -> WindowTooSmallError:
        """The refusal of a request nothing more can be cut from or excerpted in."""
        parts = self.parts_in_view(messages_of(entries), setup, request_tokens)
        return WindowTooSmallError(
            f"the request is {request_tokens} tokens ({listed_parts(parts)}), over the budget of "
            f"{self.config.budget} (window {self.config.window} - reply reserve "
            f"{self.config.reserve}) by {request_tokens - self.config.budget}, and nothing "
            "more can be cut or excerpted. Raise the window, lower reply_reserve, or shorten "
            "the largest part."
        )

    def parts_in_view(
        self, messages: Sequence[BaseMessage], setup: ModelSetup, total: int
    ) -> dict[str, int]:
        """What a request of ``total`` tokens is made of, by part: system prompt, tools, the
        pinned task, the NOTES, an open question with the work on it, and the other messages
        (the rest of ``total``, so the parts always add up to it)."""
        layout = self.layout(messages)
        head = messages[: layout.head_end]
        tools = self.tokens.count_messages([], setup.tool_schemas) if setup.tools else 0
        system_and_tools = self.count(setup, [m for m in head if isinstance(m, SystemMessage)])
        notes = (
            self.tokens.count_messages([messages[layout.notes_index]])
            if layout.notes_index is not None
            else 0
        )
        open_at = open_question_index(messages, self.detector, start=layout.noted_start)
        question = self.tokens.count_messages(messages[open_at:]) if open_at is not None else 0
        parts = {
            "system prompt": system_and_tools - tools,
            "tools": tools,
            "pinned task": self.count(setup, head) - system_and_tools,
            "NOTES": notes,
            "the open question and the work on it": question,
        }
        parts["the other messages in view"] = total - sum(parts.values())
        return parts


def listed_parts(parts: Mapping[str, int]) -> str:
    """The fixed parts as an error names them: "system prompt 24 + tools 400 + ..."."""
    return " + ".join(f"{name} {size}" for name, size in parts.items() if size)


def _first_unit_with_fresh(
    entries: Sequence[Entry], seen: set[str], first: int | None = None
) -> int:
    """Where the unit holding the first message not taken in yet starts (the end when there is
    none): the units before it need no cap, so a step sizes only what is new (``first``: the
    first such message, when known)."""
    if first is None:
        first = first_fresh(entries, seen)
    while 0 < first < len(entries) and entries[first].is_tool_result:
        first -= 1
    return first
