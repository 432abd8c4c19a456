"""Entries that left the NOTES come back into view when the turns being noted name them.

Over their budget the NOTES move the STATE entries set least recently to the archive. A later turn
may change one of them ("added 4 to c1"): without its value in view the note-taker cannot work out
the new one, so the change was skipped and the archive kept the old value for ever (a question
about c1 then found a stale figure), or the note-taker added the entry again from the turn alone.
So the notes request recalls those entries below its instructions, each as last noted, and the
note-taker updates them in place like any NOTES entry. A recalled entry the reply sets stays in
the NOTES (it was just set); one it leaves alone stays in the archive, unchanged. Nothing is
duplicated: the key is held in one place at a time.

The recall block is bounded (``room`` tokens), so the request stays within the window; entries
that do not fit are simply not recalled this time (the note-taker is not asked about them).

Pure: the caller stores the moved entries (one row each, ``moved_rows``) and counts the tokens;
a cut reads only the rows whose key's first word its noted text holds, and ``named_in`` decides
among those exactly as it would over every moved entry.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace

from keeper_middleware.archive.moved_rows import WORD, words_of
from keeper_middleware.archive.records import MovedUpdate
from keeper_middleware.errors import ConfigurationError
from keeper_middleware.notes.block import ENTRY_PREFIX, STATE_SEPARATOR, Notes

RECALL_HEADER = (
    "Entries that left the NOTES for the archive and that these turns name, as last noted "
    "(update them with SET or UNSET lines like the NOTES' own entries):"
)
"""The first line of the recall block in a notes request (docs/formats.md §2)."""
_WORD = WORD


def named_in(moved: Mapping[str, str], text: str) -> list[str]:
    """The moved keys ``text`` names as whole words (any case), in the order they moved.

    Only keys whose first case-folded word is one of the text's words can be named, so
    ``moved`` may be just those (``ArchiveStore.moved_named``): the answer is the same."""
    if not moved or not text:
        return []
    folded_text = text.casefold()
    words = words_of(text)
    named = []
    for key in moved:
        folded = key.casefold()
        if folded in words:  # the usual key, one word: no pattern to run
            named.append(key)
            continue
        if _WORD.fullmatch(folded):
            continue
        parts = _WORD.findall(folded)
        if not parts or not all(part in words for part in parts):
            continue
        if len(parts) == 1 or _whole_words(folded, folded_text):
            named.append(key)
    return named


def _whole_words(phrase: str, text: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(phrase)}(?!\w)", text) is not None


def recall_block(
    entries: Sequence[tuple[str, str]], *, room: int, count_text: Callable[[str], int]
) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The recall block for ``entries`` within ``room`` tokens, and the entries it holds.

    Empty text (and no entries) when none fits or there is nothing to recall.
    """
    if room < 0:
        raise ConfigurationError(f"room must be >= 0 tokens, got {room}")
    lines = [RECALL_HEADER]
    held: list[tuple[str, str]] = []
    total = count_text(RECALL_HEADER)
    for key, value in entries:  # one count per line, then the whole block is counted again
        line = f"{ENTRY_PREFIX}{key}{STATE_SEPARATOR}{value}"
        total += count_text(line) + 1
        if total > room:
            break
        lines.append(line)
        held.append((key, value))
    while held and count_text("\n".join(lines)) > room:  # a counter that is not additive
        lines.pop()
        held.pop()
    if not held:
        return "", ()
    return "\n".join(lines), tuple(held)


def parse_recall_block(text: str) -> tuple[tuple[str, str], ...]:
    """The entries a notes request recalls (none when it has no recall block)."""
    _, found, rest = text.partition(RECALL_HEADER)
    if not found:
        return ()
    entries = []
    for line in rest.splitlines():
        if not line.startswith(ENTRY_PREFIX):
            if line.strip():
                break
            continue
        key, separator, value = line[len(ENTRY_PREFIX) :].partition(STATE_SEPARATOR)
        if separator and key.strip() and value.strip():
            entries.append((key.strip(), value.strip()))
    return tuple(entries)


def with_recalled(notes: Notes, recalled: Sequence[tuple[str, str]]) -> Notes:
    """``notes`` with the recalled entries back in STATE (set least recently of all), so checks
    see their values and a SET updates them in place. Keys the notes hold are left alone."""
    held = {key for key, _ in notes.state}
    back = [(key, value) for key, value in recalled if key not in held]
    if not back:
        return notes
    order = notes.least_recent_keys()
    return replace(
        notes,
        state=(*notes.state, *back),
        recency=(*(key for key, _ in back), *order),
    )


def settle_recalled(
    before: Notes, after: Notes, recalled: Sequence[tuple[str, str]], touched: Collection[str]
) -> Notes:
    """``after`` without the recalled entries no change line ``touched`` (they stay in the
    archive, where they already are, as they were): only what the reply set comes back."""
    held_before = {key for key, _ in before.state}
    untouched = {key for key, _ in recalled if key not in held_before and key not in touched}
    if not untouched:
        return after
    return replace(
        after,
        state=tuple((key, value) for key, value in after.state if key not in untouched),
        recency=tuple(key for key in after.recency if key not in untouched),
    )


def track_moved(
    moved_before: Mapping[str, str],
    notes: Notes,
    moved_now: Sequence[tuple[str, str]],
    *,
    back: Collection[str] = (),
) -> dict[str, str]:
    """The entries in the archive and not the NOTES, each as last noted. A recalled entry the
    reply set or unset (``back``) leaves the list: it is in the NOTES again, or no longer
    applies; moving an entry out (again) puts it on the list with its latest value."""
    held = {key for key, _ in notes.state}
    gone = held | set(back)
    moved = {key: value for key, value in moved_before.items() if key not in gone}
    for key, value in moved_now:
        moved.pop(key, None)
        moved[key] = value
    return moved


def moved_update(
    notes: Notes,
    moved_now: Sequence[tuple[str, str]],
    *,
    back: Collection[str] = (),
    held_before: Collection[str] | None = None,
) -> MovedUpdate:
    """How a cut changes the stored moved entries (``track_moved`` is the same over a whole
    mapping): the keys the NOTES hold leave the archive's list, a recalled entry the reply
    unset (``back`` and not held) keeps its key there but no value to recall, and what moved
    out now is added with its latest value.

    ``held_before``: the keys the NOTES held before the cut. None of them is on the list (each
    cut's change commits with its NOTES), so only the keys new to the NOTES are looked for:
    the work follows what the cut changed, not the size of the NOTES."""
    held = [key for key, _ in notes.state]
    kept = set(held)
    if held_before is not None:
        before = set(held_before)
        held = [key for key in held if key not in before]
    return MovedUpdate(
        drop=tuple(held),
        forget=tuple(key for key in back if key not in kept),
        add=tuple(moved_now),
    )


class ArchivedKeys:
    """Whether a case-folded name is a moved key's (``CheckContext.archived_keys``), read from
    the archive only for the names asked about: the names the noted text gives are looked up
    at once (``prefetch``), any other when a check asks for it."""

    def __init__(
        self,
        lookup: Callable[[Collection[str]], Collection[str]],
        *,
        prefetch: Collection[str] = (),
        excluded: Collection[str] = (),
    ) -> None:
        self._lookup = lookup
        self._excluded = frozenset(excluded)
        self._keys: dict[str, set[str]] = {}
        """Folded name → the moved keys that fold to it (as read)."""
        if prefetch:
            self._read(prefetch)

    def _read(self, folded: Collection[str]) -> None:
        found: dict[str, set[str]] = {name: set() for name in folded}
        for key in self._lookup(folded):
            found.setdefault(key.casefold(), set()).add(key)
        self._keys.update(found)

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        if name not in self._keys:
            self._read((name,))
        return bool(self._keys[name] - self._excluded)

    def without(self, keys: Collection[str]) -> ArchivedKeys:
        """These, less ``keys`` (recalled entries: their values are in view)."""
        if not keys:
            return self
        fewer = ArchivedKeys(self._lookup, excluded=self._excluded | set(keys))
        fewer._keys = self._keys
        return fewer


NO_ARCHIVED_KEYS = ArchivedKeys(lambda folded: ())
"""Nothing moved."""
