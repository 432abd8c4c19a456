"""Change lines: what the model writes when asked what the turns since the NOTES changed.

The reply is read tolerantly (list markers, numbering, backticks, code fences, any case, a
``<think>`` block) because models decorate; what cannot be read is kept as "garbage" and counted,
never guessed at. Applying changes is pure and keeps everything the model did not mention, which
is why in-place notes cannot lose a line the way a full rewrite can.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from keeper_middleware.notes.block import Notes, normalise_entry
from keeper_middleware.notes.numbers import parse_number
from keeper_middleware.notes.rules import rewording_of


@dataclass(frozen=True, slots=True)
class RuleLine:
    """A standing rule or method, word for word."""

    text: str

    def render(self) -> str:
        return f"RULE: {self.text}"


@dataclass(frozen=True, slots=True)
class SetLine:
    """A state value; ``working`` is the arithmetic that produced it, when it was worked out."""

    key: str
    value: str
    working: str | None = None

    def render(self) -> str:
        line = f"SET {self.key} = {self.value}"
        return line if self.working is None else f"{line} (= {self.working})"


@dataclass(frozen=True, slots=True)
class UnsetLine:
    """A state entry that no longer applies."""

    key: str

    def render(self) -> str:
        return f"UNSET {self.key}"


@dataclass(frozen=True, slots=True)
class OpenLine:
    """A new open question or task."""

    text: str

    def render(self) -> str:
        return f"OPEN: {self.text}"


@dataclass(frozen=True, slots=True)
class CloseLine:
    """An open entry that is done, named by its exact text or a unique prefix."""

    text: str

    def render(self) -> str:
        return f"CLOSE: {self.text}"


@dataclass(frozen=True, slots=True)
class NoChanges:
    """The model says nothing changed: a usable reply with no effect."""

    def render(self) -> str:
        return "NO CHANGES"


Change = RuleLine | SetLine | UnsetLine | OpenLine | CloseLine | NoChanges


@dataclass(frozen=True, slots=True)
class ParsedReply:
    """A reply read as change lines, with the lines that matched no form kept aside."""

    changes: tuple[Change, ...] = ()
    garbage: tuple[str, ...] = ()

    @property
    def usable(self) -> bool:
        """True when the reply holds at least one change line (``NO CHANGES`` counts)."""
        return bool(self.changes)


_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_LIST_MARKER = re.compile(r"^(?:[-*•+]\s+|\d{1,3}[.)]\s+)")
_FENCE = re.compile(r"^```[\w-]*$")
_RULE = re.compile(r"^RULE\s*:\s*(?P<text>.+)$", re.IGNORECASE)
_OPEN = re.compile(r"^OPEN\s*:\s*(?P<text>.+)$", re.IGNORECASE)
_CLOSE = re.compile(r"^CLOSE\s*:\s*(?P<text>.+)$", re.IGNORECASE)
_SET = re.compile(r"^SET\s+(?P<key>[^=]+?)\s*=\s*(?P<rest>.+)$", re.IGNORECASE)
_UNSET = re.compile(r"^UNSET\s+(?P<key>.+)$", re.IGNORECASE)
_NO_CHANGES = re.compile(r"^NO\s+CHANGES?\.?$", re.IGNORECASE)


def strip_thinking(reply: str) -> str:
    """The reply without its reasoning: ``<think>`` blocks removed.

    A reply whose thinking never closed (the budget ran out) has nothing after it to read; a
    reply that shows only the closing tag (some servers drop the opening one) starts after it.
    """
    text = _THINK_BLOCK.sub("", reply)
    lowered = text.lower()
    if "</think>" in lowered:
        text = text[lowered.rindex("</think>") + len("</think>") :]
    elif "<think>" in lowered:
        text = text[: lowered.index("<think>")]
    return text


def _clean_line(line: str) -> str:
    line = line.strip()
    for _ in range(2):
        line = _LIST_MARKER.sub("", line).strip()
        if len(line) >= 2 and line.startswith("`") and line.endswith("`"):
            line = line.strip("`").strip()
        if len(line) >= 4 and line.startswith("**") and line.endswith("**"):
            line = line[2:-2].strip()
    return line


def _split_working(rest: str) -> tuple[str, str | None]:
    """Split ``value (= working)`` at the last balanced ``(= ...)`` that ends the text."""
    if not rest.endswith(")"):
        return rest, None
    depth = 0
    for index in range(len(rest) - 1, -1, -1):
        char = rest[index]
        if char == ")":
            depth += 1
        elif char == "(":
            depth -= 1
            if depth == 0:
                inner = rest[index + 1 : -1].strip()
                if not inner.startswith("="):
                    return rest, None
                return rest[:index].strip(), inner[1:].strip()
    return rest, None


def _without_final_period(rest: str) -> str:
    """ "6." and "332 (= 342 - 10)." end a sentence; the period is not part of the value."""
    if rest.endswith(".") and (rest[:-1].endswith(")") or parse_number(rest[:-1]) is not None):
        return rest[:-1].rstrip()
    return rest


def parse_change_line(line: str) -> Change | None:
    """One line as a change, or None when it matches no form of docs/formats.md §2."""
    cleaned = _clean_line(line)
    if not cleaned:
        return None
    if _NO_CHANGES.match(cleaned):
        return NoChanges()
    for pattern, kind in ((_RULE, RuleLine), (_OPEN, OpenLine), (_CLOSE, CloseLine)):
        match = pattern.match(cleaned)
        if match:
            return kind(match.group("text").strip())
    match = _UNSET.match(cleaned)
    if match:
        key = match.group("key").strip().rstrip(".").strip()
        return UnsetLine(key) if key and "=" not in key else None
    match = _SET.match(cleaned)
    if match:
        value, working = _split_working(_without_final_period(match.group("rest").strip()))
        key = match.group("key").strip()
        if not value or not key or working == "":
            return None
        return SetLine(key, value, working)
    return None


def parse_changes(reply: str) -> ParsedReply:
    """Read a notes reply: its change lines in order, and the non-empty lines that match no form."""
    changes: list[Change] = []
    garbage: list[str] = []
    for raw in strip_thinking(reply).splitlines():
        line = raw.strip()
        if not line or _FENCE.match(line):
            continue
        change = parse_change_line(line)
        if change is None:
            garbage.append(line)
        else:
            changes.append(change)
    return ParsedReply(changes=tuple(changes), garbage=tuple(garbage))


def _find_open(open_entries: Sequence[str], text: str) -> int | None:
    """Index of the open entry a CLOSE line names: exact, then normalised, then a unique prefix."""
    if text in open_entries:
        return open_entries.index(text)
    wanted = normalise_entry(text)
    normalised = [normalise_entry(entry) for entry in open_entries]
    if wanted in normalised:
        return normalised.index(wanted)
    starts = [i for i, entry in enumerate(normalised) if wanted and entry.startswith(wanted)]
    return starts[0] if len(starts) == 1 else None


def _apply(notes: Notes, changes: Sequence[Change]) -> tuple[Notes, list[Change]]:
    rules = list(notes.rules)
    state = dict(notes.state)  # keeps first-set order; a SET on a held key stays in place
    open_entries = list(notes.open)
    recency = dict.fromkeys(notes.least_recent_keys())
    unapplied: list[Change] = []
    for change in changes:
        if isinstance(change, RuleLine):
            if rewording_of(change.text, rules) is None:
                rules.append(change.text)
        elif isinstance(change, SetLine):
            state[change.key] = change.value
            recency.pop(change.key, None)
            recency[change.key] = None
        elif isinstance(change, UnsetLine):
            if change.key in state:
                del state[change.key]
                recency.pop(change.key, None)
            else:
                unapplied.append(change)
        elif isinstance(change, OpenLine):
            if normalise_entry(change.text) not in {normalise_entry(e) for e in open_entries}:
                open_entries.append(change.text)
        elif isinstance(change, CloseLine):
            index = _find_open(open_entries, change.text)
            if index is None:
                unapplied.append(change)
            else:
                del open_entries[index]
    updated = replace(
        notes,
        rules=tuple(rules),
        state=tuple(state.items()),
        open=tuple(open_entries),
        recency=tuple(recency),
    )
    return updated, unapplied


def apply_changes(notes: Notes, changes: Sequence[Change]) -> Notes:
    """The notes with ``changes`` applied in order; every entry the changes do not name is kept.

    Rules are only ever added (a rule already present, in other words or case, is not added
    again: a rewording never sits beside a rule), a SET replaces a value where it stands and
    marks its key as set last, a CLOSE that names nothing is ignored (see `unapplied`).
    """
    return _apply(notes, changes)[0]


def unapplied(notes: Notes, changes: Sequence[Change]) -> list[Change]:
    """The CLOSE lines that matched no open entry (or several), and UNSET lines of absent keys."""
    return _apply(notes, changes)[1]


def apply_and_report(notes: Notes, changes: Sequence[Change]) -> tuple[Notes, list[Change]]:
    """:func:`apply_changes` and :func:`unapplied` in one pass over the notes (a cut needs both,
    and each pass goes over every entry)."""
    return _apply(notes, changes)
