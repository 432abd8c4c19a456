"""Checks on new STATE keys: a key (or its value) must be grounded in the noted turns, so a
key the model made up never enters the NOTES."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from keeper_middleware.notes.changes import Change, SetLine
from keeper_middleware.notes.checks.base import CheckContext, Issue
from keeper_middleware.notes.numbers import amounts_in, parse_number

_KEY_WORD = re.compile(r"[^\W_]+")


def _significant_words(text: str) -> set[str]:
    return {
        word
        for word in _KEY_WORD.findall(text.casefold())
        if not word.isdigit() and (len(word) >= 3 or any(char.isdigit() for char in word))
    }


def _grounded(key: str, words: set[str], folded_text: str) -> bool:
    """Some word of the key is a word of the text; words in scripts written without spaces
    (Chinese, Japanese) count when they appear anywhere in it."""
    key_words = _significant_words(key)
    if not key_words:
        return key.casefold() in folded_text
    return any(word in words if word.isascii() else word in folded_text for word in key_words)


@dataclass(frozen=True, slots=True)
class KeysGrounded:
    """A new STATE entry must be about something the turns being noted talk about.

    A new key is made up when none of its words (three letters or more, or letters with a digit;
    bare numbers say nothing about what a key names) and
    nothing of its value (a word or an amount) appears in those turns or in the rules and open
    entries the notes hold, and it shows no working: it is left out at once. Keys the notes
    already hold, and zero values, are not questioned here.
    """

    name: str = field(default="keys_grounded", init=False)

    def check(self, changes: Sequence[Change], context: CheckContext) -> list[Issue]:
        held = {key for key, _ in context.notes.state}
        source = "\n".join((context.noted_text, *context.notes.rules, *context.notes.open))
        folded = source.casefold()
        words: set[str] | None = None
        amounts: set[float] | None = None
        issues: list[Issue] = []
        for change in changes:
            if not isinstance(change, SetLine) or change.key in held or change.working:
                continue
            if parse_number(change.value) == 0:
                continue
            words = _significant_words(source) if words is None else words
            amounts = amounts_in(source) if amounts is None else amounts
            value = parse_number(change.value)
            if (
                _grounded(change.key, words, folded)
                or _grounded(change.value, words, folded)
                or (value is not None and abs(value) in amounts)
            ):
                continue
            reason = (
                f"neither the key {change.key!r} nor the value {change.value!r} is in the turns "
                "being noted"
            )
            issues.append(Issue(change.render(), reason, self.name, "drop"))
        return issues
