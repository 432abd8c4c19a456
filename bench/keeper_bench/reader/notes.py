"""The simulated reader's note-taking: change lines for a notes request, or a whole NOTES block.

It writes what a careful model would: rules word for word, values stated outright as stated, and
worked-out values with the working from the NOTES value or the set they started at. It reads only
the turns the request asks about, so a slip in what the keeper shows it shows up in the notes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from langchain_core.messages import BaseMessage, SystemMessage

from keeper_bench.reader.logic import int_or_none, read_view, value_now
from keeper_bench.reader.messages import (
    Block,
    message_kind,
    notes_position,
    read_blocks,
    story_blocks,
)
from keeper_bench.reader.misreads import (
    NO_MISREADS,
    Misreads,
    misread_memory_and_text,
)
from keeper_bench.reader.text import Recount, open_recount
from keeper_bench.reader.text import rule_sentences as story_rule_sentences
from keeper_middleware.messages.facts import text_of
from keeper_middleware.notes.block import Notes, render_notes
from keeper_middleware.notes.changes import (
    Change,
    CloseLine,
    NoChanges,
    OpenLine,
    RuleLine,
    SetLine,
)
from keeper_middleware.notes.recall import parse_recall_block

# ---------------------------------------------------------------------------------------------
# Notes: the change lines for the turns since the NOTES, or a whole new NOTES block
# ---------------------------------------------------------------------------------------------
_KEPT_IN_REQUEST = re.compile(r"The first (?:(\d+) messages|message) after the NOTES")


def rule_sentences(messages: Sequence[BaseMessage]) -> list[str]:
    """Rule and method sentences stated in the story inputs, word for word, each once."""
    return story_rule_sentences(
        text_of(message) for message in messages if message_kind(message) == "input"
    )


def noted_span(messages: Sequence[BaseMessage]) -> tuple[int, int]:
    """The messages a notes request asks about: after the NOTES (minus those it says are already
    noted), or after the system message when there are no NOTES, up to the request."""
    end = next(
        (
            index
            for index in range(len(messages) - 1, -1, -1)
            if message_kind(messages[index]) in ("notes_request", "rewrite_request")
        ),
        len(messages),
    )
    notes_index, _, kept = notes_position(messages[:end])
    if notes_index is None:
        start = 1 if messages and isinstance(messages[0], SystemMessage) else 0
        return start, end
    if end < len(messages):
        match = _KEPT_IN_REQUEST.search(text_of(messages[end]))
        if match is not None:
            kept = max(kept, int(match.group(1) or 1))
    return notes_index + 1 + kept, end


def noted_blocks(messages: Sequence[BaseMessage]) -> list[Block]:
    start, end = noted_span(messages)
    return [block for block in story_blocks(messages) if start <= block.message_index < end]


def _every_rule(_rule: str) -> bool:
    return True


def _term(sign: str, amount: int, working: str) -> str:
    """One step of a working. A held amount is written as the other counter's own working, so
    every number in it comes from the text or the notes (the keeper checks that)."""
    if working != str(amount):
        return f" {sign} ({working})"
    if amount < 0:
        sign, amount = ("-" if sign == "+" else "+"), -amount
    return f" {sign} {amount}"


def write_changes(
    messages: Sequence[BaseMessage],
    *,
    misreads: Misreads = NO_MISREADS,
    keeps_rule: Callable[[str], bool] = _every_rule,
) -> list[Change]:
    """The change lines for a notes request: RULE lines, then one SET per counter that changed.

    A value stated outright is written as it was stated; a worked-out one shows its working from
    the NOTES value or from the set it started at. A counter whose starting value the context
    does not hold is left out rather than guessed. ``misreads`` strike what it reads (the NOTES
    values and the noted turns); a rule ``keeps_rule`` refuses is left out (`drop_rules`).
    """
    start, end = noted_span(messages)
    _, notes, _ = notes_position(messages[:end])
    blocks = noted_blocks(messages)
    values: dict[str, int | None] = {}
    workings: dict[str, str] = {}
    if notes is not None:
        values.update({key: int_or_none(value) for key, value in notes.state})
        workings.update({key: value for key, value in notes.state})
    if end < len(messages):  # entries the request brings back from the archive
        for key, recalled in parse_recall_block(text_of(messages[end])):
            if key not in values:
                values[key] = int_or_none(recalled)
                workings[key] = recalled
    read_values, groups = misread_memory_and_text(
        values, [list(block.events) for block in blocks], misreads
    )
    for key, value in values.items():
        if read_values.get(key) != value:  # a NOTES value read wrong is worked from as read
            values[key] = read_values.get(key)
            workings[key] = "" if values[key] is None else str(values[key])
    changed: list[str] = []
    for event in (event for group in groups for event in group):
        if event.name not in changed:
            changed.append(event.name)
        if not event.applied:  # seen, not applied: the value before it is written
            continue
        if event.kind == "set":
            values[event.name] = event.amount
            workings[event.name] = event.working or str(event.amount)
            continue
        amount = event.amount if event.source is None else values.get(event.source)
        value = values.get(event.name)
        if value is None or amount is None:
            values[event.name] = None
            continue
        sign = "+" if event.kind in ("add", "add_held") else "-"
        values[event.name] = value + amount if sign == "+" else value - amount
        step = str(amount) if event.source is None else workings[event.source]
        workings[event.name] = workings[event.name] + _term(sign, amount, step)
    rules = [rule for rule in rule_sentences(messages[start:end]) if keeps_rule(rule)]
    lines: list[Change] = [RuleLine(rule) for rule in rules]
    for name in changed:
        value = values.get(name)
        if value is None:
            continue
        working = workings[name]
        lines.append(SetLine(name, str(value), None if working == str(value) else working))
    lines += recount_lines(notes, read_blocks(messages[:end])[1])
    return lines or [NoChanges()]


def recount_lines(notes: Notes | None, still_open: Recount | None) -> list[Change]:
    """A recount begun and not yet finished is kept OPEN until the item that finishes it."""
    noted = [line for line in (notes.open if notes else ()) if open_recount(line) is not None]
    lines: list[Change] = [CloseLine(line) for line in noted if open_recount(line) != still_open]
    if still_open is not None and still_open.sentence() not in noted:
        lines.append(OpenLine(still_open.sentence()))
    return lines


def rewrite_notes(
    messages: Sequence[BaseMessage],
    *,
    misreads: Misreads = NO_MISREADS,
    keeps_rule: Callable[[str], bool] = _every_rule,
) -> str:
    """A complete NOTES block covering everything in the context (the full-rewrite request),
    read with the call's ``misreads``; a rule ``keeps_rule`` refuses is left out."""
    _, end = noted_span(messages)
    view = read_view(messages[:end], misreads=misreads)
    old = view.notes or Notes()
    rules = list(old.rules)
    rules += [rule for rule in rule_sentences(messages[:end]) if rule not in rules]
    rules = [rule for rule in rules if keeps_rule(rule)]
    invented = {s.event.name: s.event for s in view.sightings if s.event.working is not None}
    names = [key for key, _ in old.state]
    names += [s.event.name for s in view.sightings if s.event.name not in names]
    names = list(dict.fromkeys(names))
    state: list[tuple[str, str]] = []
    for name in names:
        value = value_now(view, name).value
        noted = old.state_value(name)
        made_up = invented.get(name)
        if value is not None and made_up is not None and made_up.amount == value:
            state.append((name, f"{value} (= {made_up.working})"))
        elif value is not None:
            state.append((name, str(value)))
        elif noted is not None:
            state.append((name, noted))
    first = old.first_item if old.first_item is not None else min(view.window_items, default=None)
    last = None if first is None else max(view.latest_item, first)
    still_open = read_blocks(messages[:end])[1]
    open_lines = [line for line in old.open if open_recount(line) is None]
    if still_open is not None:
        open_lines.append(still_open.sentence())
    covering = Notes(
        rules=tuple(rules),
        state=tuple(state),
        open=tuple(open_lines),
        first_item=first,
        last_item=last,
    )
    return render_notes(covering)
