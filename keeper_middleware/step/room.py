"""Sharing the room in view among messages (pure).

A cut can pass any message but never splits a tool call from its results, so the room is
shared per unit; within a unit the small messages keep their size and the big ones share what
is left alike (a water level), so one huge tool result never squeezes its neighbours.
"""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.messages import BaseMessage

from keeper_middleware.notes.block import parse_notes, render_notes
from keeper_middleware.step.entries import Entry


def units(entries: Sequence[Entry]) -> list[list[Entry]]:
    """The messages in the groups a cut never splits: a tool call with its results, or one."""
    grouped: list[list[Entry]] = []
    for entry in entries:
        if entry.is_tool_result and grouped:
            grouped[-1].append(entry)
        else:
            grouped.append([entry])
    return grouped


def water_level(sizes: Sequence[int], room: int, limit: int) -> int:
    """The largest cap ``c <= limit`` with ``sum(min(size, c)) <= room``: the small messages
    keep their size and the big ones share what is left alike."""
    if sum(sizes) <= room and max(sizes) <= limit:
        return limit
    low, high = 0, min(limit, max(sizes))
    while low < high:
        middle = (low + high + 1) // 2
        if sum(min(size, middle) for size in sizes) <= room:
            low = middle
        else:
            high = middle - 1
    return low


def water_level_above(sizes: Sequence[int], floors: Sequence[int], room: int, limit: int) -> int:
    """The largest cap ``c <= limit`` with ``sum(max(floor, min(size, c))) <= room``: as
    :func:`water_level`, when no message can go below its own floor (the caller has checked
    that the floors alone fit)."""
    low, high = 0, min(limit, max(sizes))
    while low < high:
        middle = (low + high + 1) // 2
        taken = sum(max(f, min(size, middle)) for size, f in zip(sizes, floors, strict=True))
        if taken <= room:
            low = middle
        else:
            high = middle - 1
    return low


def unkeep(entries: Sequence[Entry]) -> tuple[list[BaseMessage], bool]:
    """The messages with the NOTES no longer counting any message as kept in view: those are
    noted again by the next cut (a repeat the checks accept) and may leave the window with it."""
    result = [entry.message for entry in entries]
    for index, entry in enumerate(entries):
        if entry.kind == "notes":
            notes, kept = parse_notes(entry.text)
            if not kept:
                return result, False
            text = render_notes(notes, kept=0)
            result[index] = entry.message.model_copy(update={"content": text})
            return result, True
    return result, False


def without_passages(entries: Sequence[Entry]) -> tuple[list[BaseMessage], bool]:
    """The messages without the retrieved passages in view, and whether there were any.

    The passages are archived text shown again beside a question: taking them out of view
    loses nothing, and makes room for the question's own work before a cut is needed (a cut
    notes and archives what the answer may still need; the passages can be searched again)."""
    kept = [entry.message for entry in entries if entry.kind != "retrieved"]
    return kept, len(kept) < len(entries)
