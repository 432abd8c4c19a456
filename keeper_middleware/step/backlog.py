"""More history than one cut can note: the step notes it in parts, one cut each (pure).

A conversation imported at once (600 messages in one invoke, or 20,000) is more than one note
request can carry. A step used to make one cut and then refuse the window it left
(``WindowTooSmallError`` on that call and on every later one), and shrinking what it could not
cut recounted the whole window after each message. Now the messages not yet noted are walked
once, unit by unit (a message, or a tool call with its results: a cut never splits those), and
taken in parts that each fit one note request beside what stays in view (system prompt, tools,
the pinned task, the NOTES, what was kept in view). The step notes and archives the parts one
after another, so its work grows with the messages, a bounded amount a cut.

A part never passes the earliest open question when it can stop before it (an open question
never leaves the window), and never ends between a question and the keeper's messages beside
it (the RULES repeated for it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from keeper_middleware.model.setup import ModelSetup
from keeper_middleware.reinjection.questions import open_question_index
from keeper_middleware.step.entries import Entry, messages_of, sizes_of

if TYPE_CHECKING:
    from keeper_middleware.step.tail import WindowFacts
    from keeper_middleware.step.window import WindowPolicy


@dataclass(slots=True)
class Backlog:
    """The messages a step has taken in but not yet put in a part, in order."""

    entries: list[Entry]
    items: dict[str, int]
    """The item number of each of them (by message id), as they were taken in."""
    open_at: int | None = None
    """Index in ``entries`` of the earliest open question, if it lies among them."""
    start: int = 0
    """The first entry not yet in a part."""

    @property
    def done(self) -> bool:
        return self.start >= len(self.entries)

    def take(self, end: int) -> list[Entry]:
        """The entries ``[start, end)``, which leave the backlog."""
        taken = self.entries[self.start : end]
        self.start = end
        return taken

    def rest(self) -> list[Entry]:
        """Every entry not yet in a part (which all leave the backlog)."""
        return self.take(len(self.entries))


def split_backlog(
    window: WindowPolicy,
    entries: list[Entry],
    setup: ModelSetup,
    facts: WindowFacts | None = None,
) -> Backlog | None:
    """The messages past what one note request can carry, when there are any (their first
    ``start`` entries make the first part; ``facts``: the window's, when known)."""
    layout = window.layout(messages_of(entries)) if facts is None else facts.layout
    fixed = window.size_of(setup, entries[: layout.noted_start])
    room = window.config.budget - window.request_cost() - fixed
    if facts is not None and facts.noted_tokens(entries) <= room:
        return None  # everything fits (``part_end``'s usual case, from the facts)
    end = part_end(entries, layout.noted_start, room)
    if end is None:
        return None
    open_at = open_question_index(messages_of(entries), window.detector, start=layout.head_end)
    if open_at is not None and layout.noted_start < open_at < end:
        end = open_at  # the part notes what came before the open question
    return Backlog(entries, {}, open_at=open_at, start=end)


def part_state(kstate: Mapping[str, Any], backlog: Backlog) -> dict[str, Any]:
    """The keeper's state for the first part: what it holds of the backlog's messages (that
    they were taken in, and their items) moves to the backlog, and comes back with each part,
    so no cut walks the whole backlog again."""
    held = {entry.id for entry in backlog.entries[backlog.start :]}
    items: Mapping[str, int] = kstate.get("items", {})
    backlog.items = {key: items[key] for key in held if key in items}
    state = dict(kstate)
    state["seen"] = [key for key in kstate.get("seen", []) if key not in held]
    state["items"] = {key: value for key, value in items.items() if key not in held}
    return state


def with_part(
    kstate: Mapping[str, Any], backlog: Backlog, taken: Sequence[Entry]
) -> dict[str, Any]:
    """The keeper's state with a part's messages back in it (taken in, with their items)."""
    state = dict(kstate)
    state["seen"] = [*kstate.get("seen", []), *(entry.id for entry in taken)]
    state["items"] = {
        **kstate.get("items", {}),
        **{e.id: backlog.items[e.id] for e in taken if e.id in backlog.items},
    }
    return state


def part_end(
    entries: Sequence[Entry], start: int, room: int, stop: int | None = None
) -> int | None:
    """Where the first part of ``entries[start:]`` ends, or None when all of them fit ``room``.

    A part holds whole units whose sizes add up to at most ``room`` tokens; it holds at least
    one unit (a unit bigger than the room is the excerpting's to fit, not a reason to stall).
    It ends before ``stop`` (the earliest open question) when it can, and a part that would end
    between a question and the keeper's messages placed beside it ends before that question.
    Walks only as far as the part reaches.
    """
    if stop is None:  # the usual case, everything fits: summed at once, not unit by unit
        sizes = sizes_of(entries[start:])
        if min(sizes, default=0) >= 0 and sum(sizes) <= room:
            return None
    used = 0
    index = start
    while index < len(entries):
        end = _unit_end(entries, index)
        size = sum(entry.tokens for entry in entries[index:end])
        if stop is not None and index <= stop < end and index > start:
            return index  # the open question starts the next part
        if used + size > room and index > start:
            return _before_question(entries, start, index)
        used += size
        index = end
    return None


def _unit_end(entries: Sequence[Entry], index: int) -> int:
    """The end of the unit that starts at ``index``: a message with the tool results after it."""
    end = index + 1
    while end < len(entries) and entries[end].is_tool_result:
        end += 1
    return end


def _before_question(entries: Sequence[Entry], start: int, end: int) -> int:
    """``end``, moved back before the question whose keeper messages would start the next
    part (so the RULES stay beside the question they were placed for)."""
    if end >= len(entries) or entries[end].kind is None:
        return end
    back = end
    while back > start and entries[back - 1].kind is not None:
        back -= 1
    if back > start + 1 and entries[back - 1].question:
        return back - 1
    return end
