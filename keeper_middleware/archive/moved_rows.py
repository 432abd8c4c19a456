"""The rows that say which STATE entries left the NOTES for the archive, the same in every store
(pure).

Each moved entry is one row (session, key, value, order, the key's folded forms), so a cut
reads and writes only the rows it touches: the entries its noted turns name, the entries it
moves out or brings back. Kept as two JSON values per session instead (the way sessions stored
before this layout keep them: ``LEGACY_KEYS`` and ``LEGACY_ENTRIES``), every cut read, rebuilt
and rewrote the whole list, a cost that grew with every entry ever moved (5 ms a cut at first,
15 ms after 10M stream tokens).

A key is looked up by the first word of its case-folded form: the noted text names a key only if
it holds every word of it (``recall.named_in``), so the rows whose first word is among the
text's words are all the candidates there are, and ``named_in`` decides among them.

The rows are a log, never rewritten: each cut appends what it changed, tagged with the cut's
ordinal, and a branch sees, for each key, the newest row written by a cut on its chain
(:func:`latest_on_chain`). So a conversation that forks keeps the moved entries of each branch
apart without copying any.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

LEGACY_KEYS = "notes_moved_keys"
"""Per-session value of the old layout: the moved STATE keys (a list)."""
LEGACY_ENTRIES = "notes_moved_entries"
"""Per-session value of the old layout: the moved entries, key → value as last noted."""

WORD = re.compile(r"\w+")
"""What a word is, for naming a key (``recall.named_in`` uses the same)."""

MovedRow = tuple[str, str | None]
"""A moved key and its value as last noted; None: the key moved but has no value to recall
(the note-taker unset it after a recall)."""


@lru_cache(maxsize=4)
def words_of(text: str) -> frozenset[str]:
    """The case-folded words of ``text``: what a lookup by word is given. Remembered for the
    last few texts: a cut reads the words of its noted turns twice (the rows its words may
    name, then which of those the turns name), and the noted turns run to tens of thousands
    of characters."""
    return frozenset(WORD.findall(text.casefold()))


def key_lookup(key: str) -> tuple[str, str | None]:
    """The key's case-folded form and the first word of it (None when it holds no word, so no
    text can name it)."""
    folded = key.casefold()
    first = WORD.search(folded)
    return folded, None if first is None else first.group()


def legacy_rows(keys: Any, entries: Any) -> list[MovedRow]:
    """The rows for the two values of the old layout, in the order the entries moved.

    Keys listed without an entry (unset after a recall, or moved before entries were kept)
    become rows without a value; values that are not what the old layout wrote are skipped."""
    rows: dict[str, str | None] = {}
    if isinstance(keys, list):
        rows.update((key, None) for key in keys if isinstance(key, str) and key)
    if isinstance(entries, Mapping):
        for key, value in entries.items():
            if isinstance(key, str) and key and value is not None:
                rows.pop(key, None)
                rows[key] = str(value)
    return list(rows.items())


def distinct(keys: Iterable[str]) -> list[str]:
    """``keys`` once each, in order (a statement is given each key once)."""
    return list(dict.fromkeys(keys))


@dataclass(frozen=True, slots=True)
class LoggedRow:
    """One change to a moved key, as the log keeps it."""

    id: int
    """Order of writing within the session."""
    ordinal: int
    """The cut that wrote it (0: before any cut)."""
    key: str
    value: str | None
    gone: bool
    """The key is back in the NOTES (no longer moved)."""
    place: int
    """Where the key stands in the order entries moved (a forget keeps the key's place)."""


def latest_on_chain(
    rows: Iterable[LoggedRow], holds: Callable[[int], bool]
) -> dict[str, LoggedRow]:
    """Key → its newest row written by a cut the branch holds (``holds(ordinal)``), for the keys
    still moved there (a newest row that says "gone" drops the key)."""
    newest: dict[str, LoggedRow] = {}
    for row in rows:
        if not holds(row.ordinal):
            continue
        held = newest.get(row.key)
        if held is None or row.id > held.id:
            newest[row.key] = row
    return {key: row for key, row in newest.items() if not row.gone}


def in_order(rows: Mapping[str, LoggedRow]) -> list[LoggedRow]:
    """The rows in the order their keys moved."""
    return sorted(rows.values(), key=lambda row: (row.place, row.id))
