"""Full-rewrite notes: the earlier form, kept as an option to compare with in-place notes.

The model rewrites the whole NOTES block at each cut. That re-reads everything and, measured, can
stop mid-list and lose lines; in-place notes cannot. What this module does guarantee in either
form is the rule section: `merge_rewrite` puts back every rule the rewrite left out and replaces
every reworded rule by its original, word for word. STATE and OPEN are taken as rewritten, which
is the form being compared.
"""

from __future__ import annotations

import difflib
import re

from keeper_middleware.changes import normalise_entry, strip_thinking
from keeper_middleware.notes import (
    NOTES_REQUEST_TAG,
    OPEN_HEADER,
    RULES_HEADER,
    STATE_HEADER,
    Notes,
)
from keeper_middleware.numbers import amounts_in

REWRITE_REQUEST_TEXT = f"""\
{NOTES_REQUEST_TAG} Rewrite the NOTES to cover everything so far.
Reply with the complete NOTES and nothing else: the three sections RULES, STATE and OPEN, in that \
order, each header on its own line, and under each one entry per line starting with "- ".
RULES: every standing rule or method, word for word; keep every rule already in the NOTES.
STATE: one "- <key> = <value>" line for each current value or fact that later work depends on.
OPEN: the open questions and tasks."""

_SECTION = re.compile(
    r"^[#*\s]*(?P<name>RULES|STATE|OPEN)[*\s]*:?[*\s]*$",
    re.IGNORECASE,
)
_ENTRY = re.compile(r"^(?:[-*•+]|\d{1,3}[.)])\s+(?P<text>.+)$")
_WORD = re.compile(r"\w+")
REWORDING_RATIO = 0.6
"""difflib similarity (on normalised text) above which a new rule is a rewording of an old one."""


def parse_rewrite(reply: str) -> Notes | None:
    """Read a rewritten NOTES block; None when the reply has no RULES, STATE or OPEN section.

    Tolerant: the ``[NOTES]`` header may be missing, headers may carry ``#``, ``**`` or a colon,
    and a repeated key keeps its first position with its last value. Lines outside a section and
    state lines without ``=`` are not guessed at.
    """
    sections: dict[str, list[str]] = {RULES_HEADER: [], STATE_HEADER: [], OPEN_HEADER: []}
    current: str | None = None
    found = False
    for raw in strip_thinking(reply).splitlines():
        line = raw.strip().strip("`").strip()
        header = _SECTION.match(line)
        if header:
            current = header.group("name").upper()
            found = True
            continue
        entry = _ENTRY.match(line)
        if entry and current is not None and entry.group("text").strip():
            sections[current].append(entry.group("text").strip())
    if not found:
        return None
    state: dict[str, str] = {}
    for line in sections[STATE_HEADER]:
        key, separator, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if separator and key and value:
            state[key] = value
    return Notes(
        rules=tuple(dict.fromkeys(sections[RULES_HEADER])),
        state=tuple(state.items()),
        open=tuple(dict.fromkeys(sections[OPEN_HEADER])),
    )


def _words(text: str) -> set[str]:
    return set(_WORD.findall(normalise_entry(text)))


def is_rewording(new: str, old: str) -> bool:
    """Whether ``new`` says ``old`` in other words: close text, or the same numbers and most words.

    Rules whose amounts differ are different rules ("times five" is not "times six").
    """
    a, b = normalise_entry(new), normalise_entry(old)
    new_amounts, old_amounts = amounts_in(a), amounts_in(b)
    if new_amounts and old_amounts and new_amounts != old_amounts:
        return False
    if difflib.SequenceMatcher(None, a, b).ratio() >= REWORDING_RATIO:
        return True
    words_new, words_old = _words(a), _words(b)
    shared = len(words_new & words_old) / max(len(words_new), len(words_old), 1)
    return bool(old_amounts) and new_amounts == old_amounts and shared >= 0.5


def merge_rewrite(old: Notes, new: Notes) -> tuple[Notes, list[str]]:
    """The rewritten notes with the old rules restored word for word, and what was repaired.

    Every old rule keeps its place; a rewritten rule that rewords an old rule missing from the
    rewrite is dropped in favour of the original; genuinely new rules follow the old ones.
    """
    old_keys = {normalise_entry(rule) for rule in old.rules}
    new_keys = {normalise_entry(rule) for rule in new.rules}
    missing = [rule for rule in old.rules if normalise_entry(rule) not in new_keys]
    reworded: set[str] = set()
    added: list[str] = []
    repairs: list[str] = []
    for rule in new.rules:
        key = normalise_entry(rule)
        if key in old_keys or key in {normalise_entry(r) for r in added}:
            continue
        original = next((old_rule for old_rule in missing if is_rewording(rule, old_rule)), None)
        if original is None:
            added.append(rule)
        else:
            reworded.add(original)
            repairs.append(f"replaced reworded rule: {rule!r} by the original {original!r}")
    repairs += [f"restored rule: {rule!r}" for rule in missing if rule not in reworded]
    has_range = new.first_item is not None
    merged = Notes(
        rules=(*old.rules, *added),
        state=new.state,
        open=new.open,
        first_item=new.first_item if has_range else old.first_item,
        last_item=new.last_item if has_range else old.last_item,
    )
    return merged, repairs
