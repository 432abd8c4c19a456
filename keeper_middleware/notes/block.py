"""The NOTES block: what the keeper keeps in view in place of the turns it archived.

The notes are a value (`Notes`), rendered to and parsed from the fixed text of docs/formats.md §1.
Rendering sorts nothing: entries keep the order in which they were first written, so one version of
the notes differs from the one before only where something changed (and the server's prefix cache
still serves everything before that point).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace

from keeper_middleware.errors import ConfigurationError, MalformedDataError

NOTES_TAG = "[NOTES]"
NOTES_REQUEST_TAG = "[NOTES REQUEST]"
NOTES_CHECK_TAG = "[NOTES CHECK]"
RULES_TAG = "[RULES]"

# The kinds carried in ``additional_kwargs["keeper"]`` of the messages these texts go into.
KIND_NOTES = "notes"
KIND_NOTES_REQUEST = "notes_request"
KIND_NOTES_REASK = "notes_reask"
KIND_RULES = "rules"

RULES_HEADER = "RULES"
STATE_HEADER = "STATE"
OPEN_HEADER = "OPEN"
ENTRY_PREFIX = "- "
STATE_SEPARATOR = " = "

_HEADER_START = f"{NOTES_TAG} Kept by the context keeper."
_HEADER_END = "Older turns are in the archive (search_archive)."
_RANGE = re.compile(
    r"Covers (?:items (?P<first>\d+)\s*[–-]\s*(?P<last>\d+)|item (?P<single>\d+)|no items yet)\."
)
_KEPT_MANY = re.compile(
    r"\(The next (?P<n>\d+) messages were kept in view from before these notes; "
    r"they are already noted\.\)"
)
_KEPT_ONE = "(The next message was kept in view from before these notes; it is already noted.)"
_MOVED = re.compile(
    r"\((?P<n>\d+) entr(?:y|ies) set least recently (?:was|were) moved to the archive to keep "
    r"the NOTES short; search_archive finds (?:it|them)\.\)"
)


def moved_line(moved: int) -> str:
    """The one line that says how many entries left the NOTES for the archive."""
    if moved == 1:
        return (
            "(1 entry set least recently was moved to the archive to keep the NOTES short; "
            "search_archive finds it.)"
        )
    return (
        f"({moved} entries set least recently were moved to the archive to keep the NOTES "
        "short; search_archive finds them.)"
    )


def normalise_entry(text: str) -> str:
    """The form two entries are compared in: case folded, whitespace collapsed, no final period."""
    return " ".join(text.casefold().split()).rstrip(".").rstrip()


@dataclass(frozen=True, slots=True)
class Notes:
    """One version of the notes. Values, not a store: every change returns a new `Notes`."""

    rules: tuple[str, ...] = ()
    """Standing rules and methods, word for word; never removed or reworded."""
    state: tuple[tuple[str, str], ...] = ()
    """Ordered (key, value) pairs; keys are unique and keep the order they were first set in."""
    open: tuple[str, ...] = ()
    """Open questions and tasks."""
    first_item: int | None = None
    """First item (the content's own numbering) these notes account for."""
    last_item: int | None = None
    """Last item these notes account for."""
    moved: int = 0
    """How many entries have left these notes for the archive so far (over their budget)."""
    recency: tuple[str, ...] = field(default=(), compare=False)
    """STATE keys from the one set least recently to the one set last. Keys not listed count as
    older than every listed key, in STATE order; entries leave the NOTES in this order."""

    def __post_init__(self) -> None:
        if not _all_valid(self):
            _explain_invalid(self)  # raises the first problem found, naming the entry
        if self.moved < 0:
            raise ConfigurationError(
                f"moved counts entries moved to the archive: >= 0, got {self.moved}."
            )
        if (self.first_item is None) != (self.last_item is None):
            raise ConfigurationError(
                "Give both first_item and last_item, or neither (notes that cover no items yet)."
            )
        if (
            self.first_item is not None
            and self.last_item is not None
            and (self.first_item < 0 or self.last_item < self.first_item)
        ):
            raise ConfigurationError(
                f"Item range {self.first_item}–{self.last_item} is not a range: "
                "first_item must be >= 0 and <= last_item."
            )

    def state_value(self, key: str) -> str | None:
        """The value noted for ``key``, or None if the notes hold no such key."""
        for noted_key, value in self.state:
            if noted_key == key:
                return value
        return None

    def state_dict(self) -> dict[str, str]:
        """The state as a dict (insertion order kept)."""
        return dict(self.state)

    def covering(self, first_item: int | None, last_item: int | None) -> Notes:
        """A copy of these notes that says it accounts for items ``first_item``–``last_item``."""
        return replace(self, first_item=first_item, last_item=last_item)

    def least_recent_keys(self) -> list[str]:
        """STATE keys in the order they leave the NOTES: set least recently first."""
        keys = [key for key, _ in self.state]
        present = set(keys)
        listed = [key for key in dict.fromkeys(self.recency) if key in present]
        listed_set = set(listed)
        return [key for key in keys if key not in listed_set] + listed

    @property
    def is_empty(self) -> bool:
        """True when the notes hold no rule, state entry or open entry (the range is ignored)."""
        return not (self.rules or self.state or self.open)


def _all_valid(notes: Notes) -> bool:
    """Whether every entry is valid, checked over all entries at once: every version of the NOTES
    is built again from the one before (a SET, a move, a recall), and checking entry by entry
    made each of the dozen versions a cut builds cost a Python call per entry."""
    keys = [key for key, _ in notes.state]
    texts = (*notes.rules, *notes.open, *keys, *(value for _, value in notes.state))
    try:
        joined = "\x00".join(texts)
        joined_keys = "\x00".join(keys)
    except TypeError:  # not text: the entry-by-entry check names it
        return False
    if "\n" in joined or "\r" in joined or STATE_SEPARATOR in joined_keys:
        return False
    if not all(texts) or tuple(map(str.strip, texts)) != texts:
        return False
    return len(set(keys)) == len(keys)


def _explain_invalid(notes: Notes) -> None:
    """Raise the error for the first invalid entry, in the order the fields are declared."""
    for rule in notes.rules:
        _check_entry(rule, "rule")
    for entry in notes.open:
        _check_entry(entry, "open entry")
    seen: set[str] = set()
    for key, value in notes.state:
        _check_entry(key, "state key")
        _check_entry(value, f"value of state key {key!r}")
        if STATE_SEPARATOR in key:
            raise ConfigurationError(
                f"State key {key!r} contains ' = ', which separates keys from values; "
                "choose a key without it."
            )
        if key in seen:
            raise ConfigurationError(
                f"State key {key!r} appears twice; keys are unique: replace the value "
                "in place instead of adding the key again."
            )
        seen.add(key)


def _check_entry(text: str, what: str) -> None:
    if not text or text != text.strip():
        raise ConfigurationError(
            f"A {what} must be non-empty text without surrounding whitespace, got {text!r}; "
            "strip it first."
        )
    if "\n" in text or "\r" in text:
        raise ConfigurationError(
            f"A {what} must be one line, got {text!r}; each notes entry is a single line, "
            "so join it with spaces."
        )


def _range_text(notes: Notes) -> str:
    if notes.first_item is None or notes.last_item is None:
        return "Covers no items yet."
    if notes.first_item == notes.last_item:
        return f"Covers item {notes.first_item}."
    return f"Covers items {notes.first_item}–{notes.last_item}."


def kept_line(kept: int) -> str:
    """The closing line that tells a reader how many following messages are already noted."""
    if kept == 1:
        return _KEPT_ONE
    return (
        f"(The next {kept} messages were kept in view from before these notes; "
        "they are already noted.)"
    )


def render_notes(notes: Notes, *, kept: int = 0) -> str:
    """The NOTES message text (docs/formats.md §1); ``kept`` messages after it are already noted.

    Args:
        notes: the notes to render.
        kept: how many messages after the NOTES were kept in view and are already noted.

    Raises:
        ConfigurationError: ``kept`` is negative.
    """
    if kept < 0:
        raise ConfigurationError(f"kept must be >= 0 (a number of messages), got {kept}.")
    lines = [f"{_HEADER_START} {_range_text(notes)} {_HEADER_END}", RULES_HEADER]
    lines += [ENTRY_PREFIX + rule for rule in notes.rules]
    lines.append(STATE_HEADER)
    lines += [f"{ENTRY_PREFIX}{key}{STATE_SEPARATOR}{value}" for key, value in notes.state]
    if notes.moved:
        lines.append(moved_line(notes.moved))
    lines.append(OPEN_HEADER)
    lines += [ENTRY_PREFIX + entry for entry in notes.open]
    if kept:
        lines.append(kept_line(kept))
    return "\n".join(lines)


def parse_notes(text: str) -> tuple[Notes, int]:
    """Read a NOTES message back: the notes and how many following messages are already noted.

    Strict, because only the keeper writes this text: anything unexpected is an error naming
    the line, rather than a silently shorter set of notes.

    Args:
        text: a NOTES message's text, as ``render_notes`` wrote it.

    Raises:
        MalformedDataError: the text is not a NOTES message, or a line is out of place.
    """
    lines = [line.rstrip() for line in text.strip().splitlines()]
    if not lines or not lines[0].startswith(_HEADER_START):
        raise MalformedDataError(
            f"Not a NOTES message: it must start with {_HEADER_START!r} (docs/formats.md §1)."
        )
    match = _RANGE.search(lines[0])
    if match is None:
        raise MalformedDataError(
            f"The NOTES header {lines[0]!r} says no item range; expected 'Covers items A–B.', "
            "'Covers item A.' or 'Covers no items yet.'"
        )
    first = last = None
    if match.group("single") is not None:
        first = last = int(match.group("single"))
    elif match.group("first") is not None:
        first, last = int(match.group("first")), int(match.group("last"))

    sections: dict[str, list[str]] = {RULES_HEADER: [], STATE_HEADER: [], OPEN_HEADER: []}
    current: str | None = None
    kept = moved = 0
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        if kept:
            raise MalformedDataError(
                f"Line {number} {line!r} follows the kept-messages line, which is last."
            )
        if line in sections:
            current = line
        elif line.startswith(ENTRY_PREFIX) and current is not None:
            sections[current].append(line[len(ENTRY_PREFIX) :].strip())
        elif current == STATE_HEADER and (moved_match := _MOVED.fullmatch(line)) is not None:
            moved = int(moved_match.group("n"))
        elif line == _KEPT_ONE:
            kept = 1
        elif (kept_match := _KEPT_MANY.fullmatch(line)) is not None:
            kept = int(kept_match.group("n"))
        else:
            raise MalformedDataError(
                f"Line {number} of the NOTES, {line!r}, is neither a section header "
                "(RULES, STATE, OPEN), an entry starting with '- ' inside a section, "
                "nor the kept-messages line."
            )
    state = []
    for entry in sections[STATE_HEADER]:
        key, separator, value = entry.partition(STATE_SEPARATOR)
        if not separator:
            raise MalformedDataError(f"STATE entry {entry!r} has no ' = ' between key and value.")
        state.append((key.strip(), value.strip()))
    notes = Notes(
        rules=tuple(sections[RULES_HEADER]),
        state=tuple(state),
        open=tuple(sections[OPEN_HEADER]),
        first_item=first,
        last_item=last,
        moved=moved,
    )
    return notes, kept


def notes_to_json(notes: Notes) -> str:
    """The structured notes as JSON, as the archive stores each version beside its text."""
    return json.dumps(
        {
            "rules": list(notes.rules),
            "state": [list(p) for p in notes.state],
            "open": list(notes.open),
            "first_item": notes.first_item,
            "last_item": notes.last_item,
            "moved": notes.moved,
            "recency": list(notes.recency),
        },
        ensure_ascii=False,
    )


def notes_from_json(data: str) -> Notes:
    """Notes back from :func:`notes_to_json`."""
    raw = json.loads(data)
    return Notes(
        rules=tuple(raw.get("rules", ())),
        state=tuple((str(k), str(v)) for k, v in raw.get("state", ())),
        open=tuple(raw.get("open", ())),
        first_item=raw.get("first_item"),
        last_item=raw.get("last_item"),
        moved=int(raw.get("moved", 0)),
        recency=tuple(str(k) for k in raw.get("recency", ())),
    )
