"""The simulated reader editing its own memory with tools (the self-editing arms).

It learns the memory tools with the care its notes get: reading a batch, it works out each
changed counter's value from its pinned state and the batch, and writes it with one edit per
counter, as stated or worked out (a counter whose starting value its memory lacks is left out
rather than guessed); it writes a stated rule down word for word where its memory has a place
for one (a ``RULE:`` line, or a sentence of its free-text notes); it keeps within the memory's
size limit by removing what it set least recently. Then it moves on. Prose notes hold one
sentence per counter ("domo86 stood at 342."), changed in place with ``notes_replace``.

The same faults reach these calls as every other: the call's misreads strike what it reads (its
pinned values and the batch), and ``drop_rules`` leaves a stated rule unwritten, rule by rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from keeper_bench.reader.faults import ReaderFaults
from keeper_bench.reader.messages import (
    NO_MORE_BATCHES,
    READ_TOOL,
    message_kind,
    read_blocks,
    story_blocks,
)
from keeper_bench.reader.misreads import (
    NO_MISREADS,
    Misreads,
    misread_memory_and_text,
    misreads_for,
)
from keeper_bench.reader.pinned import PinnedView, read_pinned
from keeper_bench.reader.text import Recount, read_events, rule_sentences
from keeper_middleware.messages.facts import text_of

SET_TOOL = "memory_set"
DELETE_TOOL = "memory_delete"
RULE_TOOL = "memory_rule"
APPEND_TOOL = "notes_append"
REPLACE_TOOL = "notes_replace"
MEMORY_TOOLS = frozenset({SET_TOOL, DELETE_TOOL, RULE_TOOL, APPEND_TOOL, REPLACE_TOOL})
Call = tuple[str, dict[str, Any]]


def edits_memory(tools: frozenset[str]) -> bool:
    """Whether the call can edit a pinned memory (its tools include a memory tool)."""
    return bool(tools & MEMORY_TOOLS)


def pinned_view(messages: Sequence[BaseMessage]) -> PinnedView | None:
    for message in reversed(messages):
        if message_kind(message) == "pinned":
            return read_pinned(text_of(message))
    return None


def _tokens(text: str) -> int:
    return (len(text) + 3) // 4


def _value_text(value: int, working: str | None) -> str:
    return f"{value} (= {working})" if working is not None else str(value)


def batch_values(
    messages: Sequence[BaseMessage], memory: PinnedView, *, misreads: Misreads = NO_MISREADS
) -> tuple[list[str], dict[str, int | None], dict[str, str]]:
    """The counters the last message changes, in order, each one's value after it (None: its
    starting value is neither in memory nor set in the batch), and the working written for a
    value (the `invent_working` misread); read with the call's ``misreads``."""
    last = len(messages) - 1
    blocks = [block for block in story_blocks(messages) if block.message_index == last]
    remembered: dict[str, int | None] = dict(memory.values())
    values, groups = misread_memory_and_text(
        remembered, [list(block.events) for block in blocks], misreads
    )
    workings: dict[str, str] = {}
    changed: list[str] = []
    for event in (event for group in groups for event in group):
        if event.name not in changed:
            changed.append(event.name)
        if not event.applied:
            continue
        workings.pop(event.name, None)
        if event.kind == "set":
            values[event.name] = event.amount
            if event.working is not None:
                workings[event.name] = event.working
            continue
        amount = event.amount if event.source is None else values.get(event.source)
        value = values.get(event.name)
        if value is None or amount is None:
            values[event.name] = None
            continue
        values[event.name] = value + amount if event.kind in ("add", "add_held") else value - amount
    return changed, {name: values.get(name) for name in changed}, workings


def line_edits(
    memory: PinnedView,
    changed: Sequence[str],
    values: dict[str, int | None],
    rules: Sequence[str],
    *,
    with_rules: bool,
    workings: Mapping[str, str],
) -> list[Call]:
    """``memory_set`` per counter (and ``memory_rule`` per new rule), after the deletions that
    keep the state within its limit (the lines set least recently go first)."""
    sets = [
        (name, _value_text(value, workings.get(name)))
        for name in changed
        if (value := values[name]) is not None
    ]
    new_rules = [rule for rule in rules if with_rules and rule not in memory.rules]
    kept = {name: value for name, value in memory.lines}
    kept.update(sets)
    body = [*(f"RULE: {rule}" for rule in (*memory.rules, *new_rules))]
    deletions: list[str] = []
    order = [name for name, _ in memory.lines if name not in dict(sets)] + [n for n, _ in sets]

    def size() -> int:
        return _tokens("\n".join([*body, *(f"{n} {kept[n]}" for n in order)]))

    while memory.budget and size() > memory.budget and order and order[0] not in dict(sets):
        deletions.append(order.pop(0))
    calls: list[Call] = [(DELETE_TOOL, {"name": name}) for name in deletions]
    calls += [(RULE_TOOL, {"rule": rule}) for rule in new_rules]
    calls += [(SET_TOOL, {"name": name, "value": value}) for name, value in sets]
    return calls


def prose_edits(
    memory: PinnedView,
    changed: Sequence[str],
    values: dict[str, int | None],
    rules: Sequence[str],
    *,
    workings: Mapping[str, str],
) -> list[Call]:
    """One sentence per counter, replaced in place when the notes already state its value,
    and each new rule sentence appended; the oldest lines go first when over the limit."""
    lines = list(memory.prose)
    calls: list[Call] = []
    for rule in rules:
        if not any(rule in line for line in lines):
            calls.append((APPEND_TOOL, {"text": rule}))
            lines.append(rule)
    for name in changed:
        value = values[name]
        if value is None:
            continue
        sentence = f"{name} stood at {_value_text(value, workings.get(name))}."
        old = next((line for line in lines if _states_value_of(line, name)), None)
        if old is None:
            calls.append((APPEND_TOOL, {"text": sentence}))
            lines.append(sentence)
        elif old != sentence:
            calls.append((REPLACE_TOOL, {"old": old, "new": sentence}))
            lines[lines.index(old)] = sentence
    trims: list[Call] = []
    touched = {args.get("text") or args.get("new") for _, args in calls}
    while memory.budget and _tokens("\n".join(lines)) > memory.budget and lines:
        oldest = lines[0]
        if oldest in touched:
            break
        trims.append((REPLACE_TOOL, {"old": oldest, "new": ""}))
        lines.pop(0)
    return trims + calls


RECOUNT_LINE = "recount"
"""The name of the line that keeps a recount begun and not yet finished (its result comes with
the next batch, which needs it: the notes keep it OPEN the same way)."""


def recount_edits(memory: PinnedView, still_open: Recount | None, *, prose: bool) -> list[Call]:
    """Keep a recount begun in this batch until the batch that finishes it; then remove it."""
    noted = memory.open_recounts()
    wanted = [still_open.sentence()] if still_open is not None else []
    if noted == wanted:
        return []
    if prose:
        written = memory.recount_lines()
        calls: list[Call] = [(REPLACE_TOOL, {"old": line, "new": ""}) for line in written]
        return calls + [(APPEND_TOOL, {"text": line}) for line in wanted]
    if wanted:
        return [(SET_TOOL, {"name": RECOUNT_LINE, "value": wanted[0]})]
    return [(DELETE_TOOL, {"name": RECOUNT_LINE})]


def _states_value_of(line: str, name: str) -> bool:
    return any(event.kind == "set" and event.name == name for event in read_events(line))


def memory_turn(
    messages: Sequence[BaseMessage], tools: frozenset[str], faults: ReaderFaults, digest: str
) -> tuple[tuple[Call, ...], str]:
    """The reader's move in a story turn: memory edits for the batch just read, then (once the
    edits are answered) the next batch or a short reply. Returns (tool calls, text)."""
    last = messages[-1]
    reading_next = READ_TOOL in tools
    if isinstance(last, ToolMessage) and last.name in MEMORY_TOOLS:
        retry = _retry_for_room(messages)
        if retry:
            return retry, ""
        return (((READ_TOOL, {}),), "") if reading_next else ((), _read_reply(messages))
    if isinstance(last, ToolMessage) and NO_MORE_BATCHES in text_of(last):
        return (), "Done reading."
    memory = pinned_view(messages)
    last_blocks = [b for b in story_blocks(messages) if b.message_index == len(messages) - 1]
    rules = rule_sentences([text_of(last)])
    still_open = read_blocks(messages)[1]
    if memory is None or (
        not any(b.events for b in last_blocks)
        and not rules
        and ([] if still_open is None else [still_open.sentence()]) == memory.open_recounts()
    ):
        return (((READ_TOOL, {}),), "") if reading_next else ((), _read_reply(messages))
    changed, values, workings = batch_values(
        messages, memory, misreads=misreads_for(faults, digest)
    )
    rules = [rule for rule in rules if not faults.fires_for("drop_rules", digest, rule)]
    if APPEND_TOOL in tools:
        calls = prose_edits(memory, changed, values, rules, workings=workings)
    else:
        calls = line_edits(
            memory, changed, values, rules, with_rules=RULE_TOOL in tools, workings=workings
        )
    calls += recount_edits(memory, read_blocks(messages)[1], prose=APPEND_TOOL in tools)
    if not calls:
        return (((READ_TOOL, {}),), "") if reading_next else ((), _read_reply(messages))
    return tuple(calls), ""


def _retry_for_room(messages: Sequence[BaseMessage]) -> tuple[Call, ...]:
    """Edits refused for lack of room, sent again after removing as many of the lines set least
    recently (never one being set now); nothing when none was refused, or it already tried."""
    results = {
        m.tool_call_id: text_of(m)
        for m in messages
        if isinstance(m, ToolMessage) and m.name in MEMORY_TOOLS
    }
    asked = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
    if asked is None:
        return ()
    refused = [
        (call["name"], dict(call["args"]))
        for call in asked.tool_calls
        if "over its" in results.get(call.get("id") or "", "")
    ]
    editing = [
        m
        for m in messages
        if isinstance(m, AIMessage) and any(c["name"] in MEMORY_TOOLS for c in m.tool_calls)
    ]
    tried_before = (
        len(editing) >= 2 and editing[-2] is not asked and _same_turn(messages, editing[-2])
    )
    memory = pinned_view(messages)
    if not refused or memory is None or tried_before:
        return ()
    setting = {str(args.get("name")) for _, args in refused}
    if APPEND_TOOL in {name for name, _ in refused} or REPLACE_TOOL in {n for n, _ in refused}:
        frees = [(REPLACE_TOOL, {"old": line, "new": ""}) for line in memory.prose[: len(refused)]]
    else:
        oldest = [name for name, _ in memory.lines if name not in setting][: len(refused)]
        frees = [(DELETE_TOOL, {"name": name}) for name in oldest]
    return (*frees, *refused) if frees else ()


def _same_turn(messages: Sequence[BaseMessage], earlier: BaseMessage) -> bool:
    """Whether no new input came between ``earlier`` and the end (one batch's edits)."""
    position = next(i for i, m in enumerate(messages) if m is earlier)
    return not any(
        message_kind(m) == "input" and not (isinstance(m, ToolMessage) and m.name in MEMORY_TOOLS)
        for m in messages[position + 1 :]
    )


def _read_reply(messages: Sequence[BaseMessage]) -> str:
    items = [block.item for block in story_blocks(messages) if block.item is not None]
    return f"Read item {items[-1]}." if items else "OK."
