"""Keeping the NOTES within their budget: what is set least recently moves to the archive.

Without a budget the STATE grows with every name the conversation ever mentions, and so does every
call (measured along a 10M-token stream: prompt tokens per 100K stream tokens rose 2.4×), until a
verbose note-taker makes the next request impossible. Over the budget, the STATE entries set least
recently leave the NOTES, then (only if the STATE is empty) the oldest OPEN entries. Nothing is
lost: the caller archives what left, word for word, where the archive search finds it, and the
NOTES say so in one line. RULES never move (they are capped instead, see `rules.py`).

Pure: the caller gives the token counter and archives the result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from keeper_middleware.errors import ConfigurationError
from keeper_middleware.notes.block import ENTRY_PREFIX, STATE_SEPARATOR, Notes, render_notes

MOVED_TURN_NAME = "notes_overflow"
"""The ``name`` of the archived turn that holds entries moved out of the NOTES."""


@dataclass(frozen=True, slots=True)
class Fitted:
    """Notes within their budget and what had to leave them."""

    notes: Notes
    moved_state: tuple[tuple[str, str], ...] = ()
    """STATE entries moved out, set least recently first."""
    moved_open: tuple[str, ...] = ()
    """OPEN entries moved out (only when the STATE alone could not make room)."""

    @property
    def moved_any(self) -> bool:
        return bool(self.moved_state or self.moved_open)


def fit_notes(notes: Notes, *, budget: int, count_text: Callable[[str], int]) -> Fitted:
    """``notes`` cut to ``budget`` tokens by moving entries out, least recently set first.

    Per-entry counts decide how many leave (one count per line, not per try), then the whole
    rendering is counted again, so a counter that is not additive still ends within budget.
    """
    if budget < 0:
        raise ConfigurationError(f"budget must be >= 0 tokens, got {budget}")
    whole = count_text(render_notes(notes))
    if whole <= budget:
        return Fitted(notes)
    state = dict(notes.state)
    order = notes.least_recent_keys()
    total = whole + 16  # room for the one line saying what moved
    moved_keys: list[str] = []
    moved_open = 0
    while True:
        # only the entries that leave are counted: a cut moves a few of hundreds
        for key in order[len(moved_keys) :]:
            if total <= budget:
                break
            moved_keys.append(key)
            total -= count_text(_state_line(key, state[key])) + 1
        while total > budget and moved_open < len(notes.open):
            total -= count_text(ENTRY_PREFIX + notes.open[moved_open]) + 1
            moved_open += 1
        fitted = _without(notes, moved_keys, moved_open)
        size = count_text(render_notes(fitted))
        if size <= budget or (len(moved_keys) == len(order) and moved_open == len(notes.open)):
            break
        total = size + 1  # the estimate was low: go on, at least one more entry
    return Fitted(
        fitted,
        moved_state=tuple((key, state[key]) for key in moved_keys),
        moved_open=notes.open[:moved_open],
    )


def _state_line(key: str, value: str) -> str:
    return f"{ENTRY_PREFIX}{key}{STATE_SEPARATOR}{value}"


def _without(notes: Notes, keys: list[str], open_count: int) -> Notes:
    gone = set(keys)
    return replace(
        notes,
        state=tuple((key, value) for key, value in notes.state if key not in gone),
        open=notes.open[open_count:],
        recency=tuple(key for key in notes.recency if key not in gone),
        moved=notes.moved + len(keys) + open_count,
    )


def moved_text(fitted: Fitted, last_item: int | None) -> str:
    """The archived record of what left the NOTES: one entry per line, word for word."""
    where = "" if last_item is None else f" at item {last_item}"
    lines = [
        f"Entries moved out of the NOTES{where} to keep them within their budget "
        "(each as last noted):"
    ]
    lines += [_state_line(key, value) for key, value in fitted.moved_state]
    lines += [f"{ENTRY_PREFIX}OPEN: {entry}" for entry in fitted.moved_open]
    return "\n".join(lines)
