"""What the simulated reader knows from the messages it was sent: pure functions, no model.

The reader must know nothing the context does not hold, or the benchmark would measure the
generator instead of the way a context is managed. So everything here starts from the messages:
story batches, the NOTES, retrieved passages and search results ("item N: ..."), [RULES] blocks.
A value is replayed from the NOTES (or the latest "set" seen) through every change seen after it;
a reading also says what is missing or unsure, which is what the reader searches for.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from langchain_core.messages import BaseMessage

from keeper_bench.reader.files import (
    EMPTY_FILE_VIEW,
    FileView,
    file_coverage,
    read_file_view,
)
from keeper_bench.reader.messages import (
    Block,
    PassageLine,
    SearchRecord,
    notes_position,
    passage_lines,
    search_records,
    story_blocks,
)
from keeper_bench.reader.misreads import NO_MISREADS, Misreads, misread
from keeper_bench.reader.text import (
    UNKNOWN,
    AskedQuestion,
    Event,
    RulesInForce,
    answer_text,
    read_events,
    read_rules,
)
from keeper_middleware.messages.facts import text_of
from keeper_middleware.notes.block import Notes

_AFTER_ALL = (2, math.inf, math.inf)
_AFTER_THE_BATCH = 10**9
"""Where a value line of an item read back whole stands: after the batch's own changes."""


# ---------------------------------------------------------------------------------------------
# The reader's view: what it knows, and how sure
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Sighting:
    """An event seen somewhere in the context, placed in story order."""

    phase: int
    """0: before the NOTES point (already accounted for by the NOTES); 1: after it."""
    item: float
    order: int
    event: Event

    @property
    def key(self) -> tuple[float, float, float]:
        return (self.phase, self.item, self.order)


@dataclass(frozen=True, slots=True)
class Gap:
    """What a search could add: mentions of ``query`` in items ``lo``–``hi`` (None: open)."""

    query: str
    lo: int | None
    hi: int | None


@dataclass(frozen=True, slots=True)
class Reading:
    value: int | None
    gap: Gap | None = None
    """Set when the value is missing or unsure and a search could settle it."""


@dataclass(frozen=True, slots=True)
class ReaderView:
    notes: Notes | None
    notes_values: Mapping[str, int]
    sightings: tuple[Sighting, ...]
    window_items: frozenset[int]
    searches: tuple[SearchRecord, ...]
    rules: RulesInForce
    latest_item: int
    notes_item: int | None
    """The last item the NOTES account for (0 for NOTES that cover no items yet); None: no NOTES."""
    history: FileView = EMPTY_FILE_VIEW
    """What the history file the context points to has shown (``reader.files``)."""
    files_covered: tuple[tuple[str, int, int], ...] = ()
    """(name, first item, last item) where the file showed every mention of a name."""

    def covered(self, query: str) -> list[tuple[int, int]]:
        """Item ranges where every mention of ``query`` is in view."""
        ranges = [(item, item) for item in self.window_items]
        for record in self.searches:
            if record.query == query and record.outcome == "complete":
                ranges.append((record.from_item or 1, record.to_item or self.latest_item))
        ranges += [(first, last) for name, first, last in self.files_covered if name == query]
        return sorted(ranges)


def int_or_none(text: str) -> int | None:
    return int(text) if re.fullmatch(r"-?\d+", text.strip()) else None


def read_view(messages: Sequence[BaseMessage], *, misreads: Misreads = NO_MISREADS) -> ReaderView:
    """Everything the reader knows from ``messages``, with the call's ``misreads`` applied to
    what it read (the NOTES values, the story batches and the item-tagged lines alike)."""
    notes_index, notes, kept = notes_position(messages)
    after = -1 if notes_index is None else notes_index + kept
    notes_item = None if notes is None else (notes.last_item or 0)
    blocks = story_blocks(messages)
    story_count = len(blocks)
    history = read_file_view(messages)
    file_blocks = _file_blocks(history, {block.item for block in blocks})
    read_back = frozenset(block.item for block in file_blocks)
    blocks += file_blocks
    window_items = frozenset(block.item for block in blocks if block.item is not None)
    passages = [
        _values_only(line) if line.item in read_back else line
        for line in passage_lines(messages)
        if line.item not in window_items or line.item in read_back
    ]
    notes_values: dict[str, int] = {}
    if notes is not None:
        for key, value in notes.state:
            number = int_or_none(value)
            if number is not None:
                notes_values[key] = number
    if misreads:
        notes_values, blocks, passages = _misread_view(notes_values, blocks, passages, misreads)
    sightings: list[Sighting] = []
    order = 0
    current_item: float = notes_item or 0
    for position, block in enumerate(blocks):
        phase = 1 if block.message_index > after else 0
        if position >= story_count:  # a batch read from a file: placed by its item
            phase = 1 if notes_item is None or (block.item or 0) > notes_item else 0
        elif block.item is not None:
            current_item = block.item
        item = block.item if block.item is not None else current_item + 0.5
        for event in block.events:
            sightings.append(Sighting(phase, item, order, event))
            order += 1
    for line in passages:
        phase = 1 if notes_item is None or line.item > notes_item else 0
        first = _AFTER_THE_BATCH if line.item in read_back else 0
        for position, event in enumerate(line.events):
            sightings.append(Sighting(phase, line.item, first + line.rank * 100 + position, event))
    latest = max([*window_items, *(line.item for line in passages), notes_item or 0, 0])
    everything = "\n".join(text_of(message) for message in messages)
    return ReaderView(
        notes=notes,
        notes_values=notes_values,
        sightings=tuple(sorted(sightings, key=lambda s: s.key)),
        window_items=window_items,
        searches=tuple(search_records(messages)),
        rules=read_rules(everything),
        latest_item=latest,
        notes_item=notes_item,
        history=history,
        files_covered=tuple(file_coverage(history, latest)),
    )


def _values_only(line: PassageLine) -> PassageLine:
    """A passage line of an item read back whole from a file: only its values ("item 40: domo86
    stood at 312."), a summary's working the batch alone may not give (a change by the amount
    another counter held); its changes are the batch's own, not to be counted twice."""
    return replace(line, events=tuple(event for event in line.events if not event.actor))


def _file_blocks(history: FileView, seen: set[int | None]) -> list[Block]:
    """The whole batches read from a history file, one per item not already in view."""
    blocks: list[Block] = []
    for batch in history.batches:
        if batch.item not in seen:
            seen.add(batch.item)
            blocks.append(Block(batch.message_index, batch.item, tuple(read_events(batch.text))))
    return blocks


def _misread_view(
    notes_values: Mapping[str, int],
    blocks: Sequence[Block],
    passages: Sequence[PassageLine],
    misreads: Misreads,
) -> tuple[dict[str, int], list[Block], list[PassageLine]]:
    """The NOTES values, batches and passage lines after the call's misreads: one group per
    text (the NOTES values, each batch, each item's passage lines)."""
    by_item: dict[int, list[int]] = {}
    for index, line in enumerate(passages):
        by_item.setdefault(line.item, []).append(index)
    memory = [Event("set", key, value, None, "") for key, value in notes_values.items()]
    groups: list[list[Event]] = [memory, *(list(block.events) for block in blocks)]
    for indices in by_item.values():
        groups.append([event for i in indices for event in passages[i].events])
    read = misread(groups, misreads, memory=frozenset({0}))
    values = {e.name: e.amount for e in read[0] if e.amount is not None}
    new_blocks = [
        replace(block, events=tuple(events))
        for block, events in zip(blocks, read[1:], strict=False)
    ]
    new_passages = list(passages)
    for indices, events in zip(by_item.values(), read[1 + len(blocks) :], strict=True):
        # the item's lines share its events again, in order (a line may lose or change one)
        first, *rest = indices
        new_passages[first] = replace(passages[first], events=tuple(events))
        for i in rest:
            new_passages[i] = replace(passages[i], events=())
    return values, new_blocks, new_passages


def _uncovered(covered: Sequence[tuple[int, int]], lo: int, hi: int) -> tuple[int, int] | None:
    """The highest stretch of ``lo``–``hi`` that no range covers (latest first: it matters most)."""
    merged: list[tuple[int, int]] = []
    for first, last in sorted(covered):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    position = hi
    for first, last in reversed(merged):
        if position < lo:
            return None
        if last < position:
            return (max(last + 1, lo), position)
        if first <= position:
            position = first - 1
    return (lo, position) if position >= lo else None


def _gap(view: ReaderView, name: str, lo: int, hi: int) -> Gap | None:
    stretch = _uncovered(view.covered(name), max(lo, 1), hi)
    if stretch is None:
        return None
    low = None if stretch[0] <= 1 else stretch[0]
    high = None if stretch[1] >= view.latest_item else stretch[1]
    return Gap(name, low, high)


def value_of(
    view: ReaderView,
    name: str,
    *,
    before: tuple[float, float, float],
    through_item: int,
    depth: int = 0,
) -> Reading:
    """The value of ``name`` just before the point ``before`` (a sighting key)."""
    if depth > 20:
        return Reading(None)
    seen = [s for s in view.sightings if s.event.name == name and s.key < before]
    notes_item = view.notes_item
    if name in view.notes_values and notes_item is not None and through_item >= notes_item:
        value: int | None = view.notes_values[name]
        start_item = notes_item
        replay = [s for s in seen if s.phase == 1]
    else:
        sets = [position for position, s in enumerate(seen) if s.event.kind == "set"]
        if not sets:
            return Reading(None, _gap(view, name, 1, through_item))
        value, start_item = None, int(seen[sets[-1]].item)
        replay = seen[sets[-1] :]
    gap = _gap(view, name, start_item + 1, through_item)
    for sighting in replay:
        event = sighting.event
        if not event.applied:  # seen but not applied: the value stays what it was
            continue
        if event.kind == "set":
            value = event.amount
            continue
        amount = event.amount
        if event.source is not None:
            other = value_of(
                view,
                event.source,
                before=sighting.key,
                through_item=int(sighting.item),
                depth=depth + 1,
            )
            amount, gap = other.value, gap or other.gap
        if value is None or amount is None:
            value = None
        else:
            value = value + amount if event.kind in ("add", "add_held") else value - amount
    return Reading(value, gap)


def value_now(view: ReaderView, name: str) -> Reading:
    return value_of(view, name, before=_AFTER_ALL, through_item=view.latest_item)


def value_at_end_of(view: ReaderView, name: str, item: int) -> Reading:
    notes_item = view.notes_item
    phase = 1 if notes_item is None or item >= notes_item else 0
    return value_of(view, name, before=(phase, item, math.inf), through_item=item)


def who_changed(view: ReaderView, name: str, item: int) -> tuple[str | None, Gap | None]:
    """The actor of the first change to ``name`` in ``item``, and a gap when unsure."""
    first = next(
        (
            s
            for s in view.sightings
            if s.event.name == name and s.item == item and s.event.actor  # not a moved entry
        ),
        None,
    )
    gap = _gap(view, name, item, item)
    gap = None if gap is None else Gap(name, item, item)
    return (None if first is None else first.event.actor), gap


@dataclass(frozen=True, slots=True)
class Finding:
    """The reader's answer to one question, and what a search could add to it."""

    number: int
    answer: str
    gap: Gap | None
    more: tuple[Gap, ...] = ()
    """Further searches that could add to it (one per counter an order or gist names)."""

    @property
    def gaps(self) -> tuple[Gap, ...]:
        return tuple(g for g in (self.gap, *self.more) if g is not None)


# ---------------------------------------------------------------------------------------------
# Questions about a counter's history: what the view shows of its changes, and where it is blind
# ---------------------------------------------------------------------------------------------
def changes_seen(view: ReaderView, name: str) -> list[Sighting]:
    """The changes to ``name`` the view shows (with an actor: not a memory's value line)."""
    return [s for s in view.sightings if s.event.name == name and s.event.actor]


def before_last(view: ReaderView, name: str) -> Reading:
    """The value ``name`` held before its last change: worked back from the value now when that
    change moved it by a stated amount, else replayed up to the change."""
    seen = changes_seen(view, name)
    if not seen:
        return Reading(None, _gap(view, name, 1, view.latest_item))
    last = seen[-1]
    after_gap = _gap(view, name, int(last.item) + 1, view.latest_item)
    event = last.event
    now = value_now(view, name)
    if now.value is not None and event.amount is not None and event.kind in ("add", "take"):
        back = now.value - event.amount if event.kind == "add" else now.value + event.amount
        return Reading(back, after_gap or now.gap)
    # the NOTES value already holds the change when the NOTES cover its item
    through = int(last.item) if last.phase == 1 else int(last.item) - 1
    earlier = value_of(view, name, before=last.key, through_item=through)
    return Reading(earlier.value, after_gap or earlier.gap)


def count_in(view: ReaderView, name: str, first: int, last: int) -> tuple[int, Gap | None]:
    """How many changes to ``name`` the view shows in items ``first``–``last``, and the part of
    the span where a search could show more."""
    count = sum(1 for s in changes_seen(view, name) if first <= s.item <= last)
    gap = _gap(view, name, first, last)
    return count, None if gap is None else Gap(name, first, last)


def first_seen(view: ReaderView, name: str) -> tuple[float | None, Gap | None]:
    """The item of the first change to ``name`` the view shows, and the stretch before it where
    an earlier one could hide."""
    seen = changes_seen(view, name)
    if not seen:
        return None, _gap(view, name, 1, view.latest_item)
    return seen[0].item, _gap(view, name, 1, int(seen[0].item) - 1)


def _history_answer(view: ReaderView, question: AskedQuestion) -> Finding:
    number, name = question.number, question.name
    if question.kind == "before_last":
        if name in view.rules.confidential:
            return Finding(number, "protected", None)
        reading = before_last(view, name)
        return Finding(number, answer_text("old", name, reading.value, view.rules), reading.gap)
    if question.kind == "count":
        assert question.item is not None and question.until is not None
        count, gap = count_in(view, name, question.item, question.until)
        return Finding(number, str(count), gap)
    if question.kind == "order":
        names = (name, *question.others)
        firsts = [first_seen(view, n) for n in names]
        gaps = tuple(g for _, g in firsts if g is not None)
        known = [(item, n) for (item, _), n in zip(firsts, names, strict=True) if item is not None]
        text = min(known)[1] if len(known) == len(names) else UNKNOWN
        return Finding(number, text, gaps[0] if gaps else None, gaps[1:])
    assert question.item is not None and question.until is not None  # gist
    names = (name, *question.others)
    counted = [count_in(view, n, question.item, question.until) for n in names]
    gaps = tuple(g for _, g in counted if g is not None)
    best = max(count for count, _ in counted)
    text = UNKNOWN if best == 0 else names[[c for c, _ in counted].index(best)]
    return Finding(number, text, gaps[0] if gaps else None, gaps[1:])


def answer(view: ReaderView, question: AskedQuestion) -> Finding:
    """Answer one question from the view (rules apply only when they are in the context)."""
    rules, name = view.rules, question.name
    if question.kind in ("before_last", "count", "order", "gist"):
        return _history_answer(view, question)
    if question.kind == "who":
        assert question.item is not None
        actor, gap = who_changed(view, name, question.item)
        return Finding(question.number, actor or UNKNOWN, gap)
    if name in rules.confidential:
        return Finding(question.number, "protected", None)
    if question.kind == "old":
        assert question.item is not None
        reading = value_at_end_of(view, name, question.item)
    else:
        reading = value_now(view, name)
    gap = reading.gap
    if question.kind == "tally" and rules.tally is None:
        gap = gap or Gap("tally", None, None)
    text = answer_text(question.kind, name, reading.value, rules)
    return Finding(question.number, text, gap)
