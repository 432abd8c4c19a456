"""A message as the archive keeps it: word for word, with what a reader needs to follow it.

Every path into the archive (a cut, a message archived whole before it is excerpted) goes
through :func:`archived_turn`, so a turn reads back the same however it left the window.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from keeper_middleware.archive.records import ArchivedTurn
from keeper_middleware.messages.facts import (
    reasoning_of,
    role_of,
    storable_text,
    strip_reasoning,
    text_of,
)
from keeper_middleware.step.cut import CutPlan
from keeper_middleware.step.entries import Entry


def archived_turn(session: str, message: BaseMessage, item: int | None) -> ArchivedTurn:
    """The archive's record of ``message``: text that any store can hold (lone surrogates
    replaced), tool calls as JSON, and the reasoning kept apart from the reply it led to."""
    tool_calls = message.tool_calls if isinstance(message, AIMessage) else []
    content = text_of(strip_reasoning(message) if isinstance(message, AIMessage) else message)
    return ArchivedTurn(
        session=session,
        msg_id=str(message.id),
        item=item,
        role=role_of(message),
        content=storable_text(content),
        tool_calls_json=storable_text(json.dumps(tool_calls, ensure_ascii=False, default=str)),
        tool_call_id=message.tool_call_id if isinstance(message, ToolMessage) else None,
        name=storable_text(message.name) if message.name else message.name,
        reasoning=storable_text(reasoning_of(message)),
    )


def leaving_turns(
    session: str,
    entries: Sequence[Entry],
    plan: CutPlan,
    items: Mapping[str, int],
    *,
    resolve: Callable[[ArchivedTurn, BaseMessage], ArchivedTurn] | None = None,
) -> list[ArchivedTurn]:
    """The turns a cut archives: everything that leaves the window except the keeper's own
    messages (the NOTES are versioned apart) and the stored system prompt (it never leaves).
    ``resolve`` may replace a message's turn (an excerpt's, by the record it stands for)."""
    leaving = [*entries[: plan.layout.head_end], *(entries[i] for i in plan.leaving)]
    turns = []
    for e in leaving:
        if e.kind is not None or (e is entries[0] and e.is_system):
            continue
        turn = archived_turn(session, e.message, items.get(e.id))
        turns.append(turn if resolve is None else resolve(turn, e.message))
    return turns
