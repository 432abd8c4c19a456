"""A history handed back whole, with the keeper's earlier messages in it.

A keeper agent run as a node of a parent graph that shares ``messages`` (a supervisor, a
multi-agent graph) starts every call afresh from the parent's messages: its own state channel
stays behind, and the parent's list holds every message the agent ever returned, merged by id in
the order each first came back: the NOTES of every cut, the RULES beside every question, and the
turns the archive has taken since. Read as they stand, the NOTES stack up in the request (four
blocks at once were seen) and the archived turns pass for new input, noted and cut again.

The keeper's own messages are marked (:mod:`keeper_middleware.messages.marks`), so such a history
is recognised and brought back to the window the agent last left: the head, the newest NOTES
(the one whose cut the archive committed last), the turns the archive does not hold, and each
RULES block only while the question it was placed beside is still in view. A window the keeper
left itself (a graph without a checkpointer handed its output back) comes out unchanged.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from langchain_core.messages import BaseMessage

from keeper_middleware.messages.facts import keeper_kind, kind_positions, text_of
from keeper_middleware.step.cut import find_layout
from keeper_middleware.step.excerpts import EXCERPT_TAG

_BESIDE_A_QUESTION = ("rules", "retrieved")


def window_of(
    messages: Sequence[BaseMessage],
    *,
    newest_notes: BaseMessage,
    archived: Collection[str],
    pinned_head: int,
) -> list[BaseMessage]:
    """The window a history handed back whole stands for; a window as the keeper left it
    (one NOTES message, right after the head) is returned as it is.

    Args:
        messages: the history as handed back (the keeper's marks already checked).
        newest_notes: the NOTES message of the branch's latest cut among them.
        archived: the ids among ``messages`` that the archive holds.
        pinned_head: how many leading inputs stay in view for ever (the task).
    """
    if as_left(messages, pinned_head=pinned_head):
        return list(messages)
    rest: list[BaseMessage] = []
    beside: str | None = None  # the id of the latest turn kept, while no RULES follow it yet
    for message in messages:
        kind = keeper_kind(message)
        if kind == "notes":
            continue  # the newest is placed after the head below; the others are superseded
        if kind in _BESIDE_A_QUESTION:
            if beside is not None:
                rest.append(message)
            continue
        if kind is None and message.id in archived and not is_excerpt(message):
            beside = None  # what was placed beside an archived turn leaves with it
            continue
        rest.append(message)
        beside = message.id if kind is None else beside
    head_end = find_layout(rest, pinned_head=pinned_head, kept=0).head_end
    return [*rest[:head_end], newest_notes, *rest[head_end:]]


def as_left(messages: Sequence[BaseMessage], *, pinned_head: int) -> bool:
    """Whether ``messages`` are a window as the keeper leaves it: no NOTES, or one NOTES
    message right after the head. Anything else was handed back whole (a parent graph merged
    every message the agent returned into its own list, whatever its keeper channel says).

    Args:
        messages: the history as given.
        pinned_head: how many leading inputs stay in view for ever (the task).
    """
    notes_at = kind_positions(messages, "notes")
    if not notes_at:
        return True
    return notes_at == [find_layout(messages, pinned_head=pinned_head, kept=0).head_end]


def is_excerpt(message: BaseMessage) -> bool:
    """A message archived whole that stands in view as an excerpt (its id is archived, and it
    is still in view)."""
    return EXCERPT_TAG in text_of(message)
