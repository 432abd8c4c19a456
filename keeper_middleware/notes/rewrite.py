"""Full-rewrite notes: the earlier form, kept as an option to compare with in-place notes.

The model rewrites the whole NOTES block at each cut. That re-reads everything and, measured, can
stop mid-list and lose lines; in-place notes cannot. What this module does guarantee in either
form is the rule section: `merge_rewrite` puts back every rule the rewrite left out, word for
word, never lets a rewording replace a rule or sit beside it, and admits a new rule only when it is
an instruction the user or the system prompt gave. STATE and OPEN are taken as rewritten, which is
the form being compared.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from keeper_middleware.notes.block import (
    NOTES_REQUEST_TAG,
    OPEN_HEADER,
    RULES_HEADER,
    STATE_HEADER,
    Notes,
    normalise_entry,
)
from keeper_middleware.notes.changes import strip_thinking
from keeper_middleware.notes.rules import is_rewording, rewording_of

__all__ = ["REWRITE_REQUEST_TEXT", "is_rewording", "merge_rewrite", "parse_rewrite"]

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


def merge_rewrite(
    old: Notes,
    new: Notes,
    *,
    accept: Callable[[str], bool] | None = None,
    max_rules: int | None = None,
) -> tuple[Notes, list[str]]:
    """The rewritten notes with the old rules restored word for word, and what was repaired.

    Every old rule keeps its place; a rewritten rule that says an old rule (or a rule added just
    before it) in other words is left out, whether the rewrite kept the original or not; a new rule
    ``accept`` refuses (not an instruction the user gave) or past ``max_rules`` is left out;
    genuinely new rules follow the old ones.
    """
    old_keys = {normalise_entry(rule) for rule in old.rules}
    new_keys = {normalise_entry(rule) for rule in new.rules}
    missing = [rule for rule in old.rules if normalise_entry(rule) not in new_keys]
    added: list[str] = []
    repairs: list[str] = []
    for rule in new.rules:
        key = normalise_entry(rule)
        if key in old_keys or key in {normalise_entry(r) for r in added}:
            continue
        original = rewording_of(rule, (*old.rules, *added))
        if original is not None:
            repairs.append(f"left out reworded rule: {rule!r} (the rule is {original!r})")
        elif accept is not None and not accept(rule):
            repairs.append(f"left out rule nobody gave: {rule!r}")
        elif max_rules is not None and len(old.rules) + len(added) >= max_rules:
            repairs.append(f"left out rule past the cap of {max_rules}: {rule!r}")
        else:
            added.append(rule)
    repairs += [f"restored rule: {rule!r}" for rule in missing]
    has_range = new.first_item is not None
    merged = Notes(
        rules=(*old.rules, *added),
        state=new.state,
        open=new.open,
        first_item=new.first_item if has_range else old.first_item,
        last_item=new.last_item if has_range else old.last_item,
        moved=old.moved,
        recency=_recency_after_rewrite(old, new),
    )
    return merged, repairs


def _recency_after_rewrite(old: Notes, new: Notes) -> tuple[str, ...]:
    """Keys whose value the rewrite changed or added count as set last."""
    before = old.state_dict()
    changed = [key for key, value in new.state if before.get(key) != value]
    changed_set = set(changed)
    unchanged = [key for key in old.least_recent_keys() if key not in changed_set]
    return (*unchanged, *changed)
