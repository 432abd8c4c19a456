"""A round of tool calls too big for the window even at its smallest, folded to one pointer pair
(pure).

A model's choice of how many tools to call at once must never end a thread. Fifty parallel
calls in a 4K window are about 1.7K tokens of calls alone, before a single result: with every
result at its smallest (a one-line pointer) the round still did not fit beside a note request,
so the step raised ``WindowTooSmallError``, and since the results stay in the graph's state,
so did every later one. Such a round is now folded: every message of it (the reply that made
the calls, each result) is archived word for word, and in view the round becomes one call and
one result: the reply keeps its id and its first call's id, now a ``search_archive`` read of
the round, and the result says what was folded and how to read it back page by page (each
message of the round in turn, every result whole). The model reads the round like any excerpt.

What stays of the round in view carries the marks an excerpt carries (the record it stands
for), so a later cut archives each of the two whole records again, which its branch already
holds: nothing is lost or doubled.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from keeper_middleware.archive.records import ArchivedTurn
from keeper_middleware.messages.facts import text_of
from keeper_middleware.search.branch_guards import GUARD_ARTIFACT, STEP_ARTIFACT
from keeper_middleware.search.schema import SEARCH_TOOL_NAME
from keeper_middleware.step.entries import Entry
from keeper_middleware.step.excerpts import EXCERPT_TAG, archived_text, stub_line

ROUND_KEY_PREFIX = "round:"
"""Archive value key (``round:REF``) of the message ids a folded round's reference reads."""


def round_ref(ref: str) -> str:
    """The reference a folded round is read by, from its reply's own excerpt reference (a
    different one: the reply alone stays readable by its own)."""
    return "r" + ref[1:]


def foldable(unit: Sequence[Entry], seen: set[str]) -> bool:
    """Whether ``unit`` is a round that can be folded: a reply with tool calls and its results,
    all of them new (a round partly in view already was sized when it came)."""
    if len(unit) < 2 or not all(e.fresh(seen) for e in unit):
        return False
    first = unit[0].message
    return isinstance(first, AIMessage) and bool(first.tool_calls)


def round_pointer_line(ref: str, calls: int) -> str:
    """The one result a folded round leaves: what was folded, and how to read it back."""
    return (
        f"{EXCERPT_TAG} {calls} tool calls at once were too many for the window: the calls and "
        f'every result are archived whole. Read them with search_archive(read="{ref}", page=1).'
    )


def folded_pair(
    messages: Sequence[BaseMessage], ref: str, reply_stub: str
) -> tuple[AIMessage, ToolMessage]:
    """The reply and the one result a folded round stands as in view: the reply's id, text (its
    stub when longer) and first call id, now reading the round; the first result's id. The
    result carries the newest search guards' state of the round, so the guards go on."""
    reply = messages[0]
    assert isinstance(reply, AIMessage) and reply.tool_calls
    first_call = str(reply.tool_calls[0].get("id") or "")
    text = text_of(reply)
    kwargs = {
        k: v for k, v in reply.additional_kwargs.items() if k not in ("tool_calls", "function_call")
    }
    call = {"name": SEARCH_TOOL_NAME, "args": {"read": ref}, "id": first_call, "type": "tool_call"}
    folded_reply = reply.model_copy(
        update={
            "content": text if len(text) <= len(reply_stub) else reply_stub,
            "tool_calls": [call],
            "invalid_tool_calls": [],
            "additional_kwargs": kwargs,
        }
    )
    results = [m for m in messages[1:] if isinstance(m, ToolMessage)]
    first = results[0] if results else None
    pointer = ToolMessage(
        content=round_pointer_line(ref, len(reply.tool_calls)),
        id=first.id if first is not None else f"{reply.id}-round",
        tool_call_id=first_call,
        name=SEARCH_TOOL_NAME,
        artifact=newest_guard(results),
    )
    return folded_reply, pointer


def newest_guard(results: Sequence[ToolMessage]) -> dict[str, Any] | None:
    """The newest search guards' state the round's results carry (None: none carries one)."""
    best: dict[str, Any] | None = None
    for result in results:
        artifact = result.artifact
        if isinstance(artifact, Mapping) and GUARD_ARTIFACT in artifact:
            step = artifact.get(STEP_ARTIFACT)
            if best is None or (isinstance(step, int) and step > int(best[STEP_ARTIFACT] or 0)):
                best = dict(artifact)
    return best


def round_text(turns: Sequence[ArchivedTurn]) -> str:
    """What a read of a folded round pages through: the reply's text, then each call with its
    result under it, whole (a call read beside what it returned, not fifty pages later)."""
    reply, results = turns[0], {t.tool_call_id: t for t in turns[1:] if t.tool_call_id}
    parts = [f"[ai]\n{reply.content}"] if reply.content else []
    try:
        calls = json.loads(reply.tool_calls_json)
    except ValueError:
        calls = []
    answered: set[str] = set()
    for call in calls if isinstance(calls, list) else []:
        if not isinstance(call, dict):
            continue
        call_id = str(call.get("id") or "")
        args = json.dumps(call.get("args"), ensure_ascii=False, default=str)
        parts.append(f"[call {call_id}] {call.get('name')}({args})")
        result = results.get(call_id)
        if result is not None:
            answered.add(call_id)
            parts.append(f"[result {call_id}]\n{result.content}")
    parts += [
        f"[{t.role} {t.tool_call_id or t.msg_id}]\n{archived_text(t.content, t.tool_calls_json)}"
        for t in turns[1:]
        if t.tool_call_id not in answered
    ]
    return "\n".join(parts)


def reply_stub(ref: str) -> str:
    """The text of a folded reply whose own text is longer than this (it is archived whole)."""
    return stub_line(ref)
