"""The content's own numbering: which item (batch, ticket) each new input is.

Search results and notes count only in these numbers, never in message indices: mixing the two
numberings cost a measured run thirteen answers.

Real numbering is not always tidy: a ticket queue restarts, an import jumps from "Item 999" to
"Item 21", a heading quotes a number no integer column can hold. None of that may raise: a
number is taken as stated when it is a whole number an archive can store, and ignored (the
input gets the next number) when it is not.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import BaseMessage, ToolMessage

from keeper_middleware.messages.facts import is_input, text_of

LARGEST_ITEM = 2**53 - 1
"""The largest stated item number taken as stated: it survives JSON, SQLite and PostgreSQL
integers alike (a bigger one is treated as no number at all)."""


ITEMS_SINCE_NOTES = "items_since_notes"
"""The keeper's state key counting the items taken in since the last cut (the item cadence)."""


def items_since_notes(kstate: Mapping[str, Any]) -> int:
    """How many items arrived since the last cut: counted as they arrive, so numbering that
    restarts or goes back counts like any other (a state saved before the count was kept
    falls back to the difference of the numbers, never below zero)."""
    counted = kstate.get(ITEMS_SINCE_NOTES)
    if counted is not None:
        return int(counted)
    return max(0, int(kstate.get("last_item", 0)) - int(kstate.get("notes_item", 0)))


class ItemNumbering:
    """Gives each new input its item number: the one it states, or the next one."""

    __slots__ = ("_pattern", "_tools")

    def __init__(self, pattern: str | None, item_tools: Sequence[str] = ()) -> None:
        self._pattern = re.compile(pattern, re.MULTILINE) if pattern else None
        self._tools = frozenset(item_tools)

    def is_new_input(self, message: BaseMessage) -> bool:
        """A user message, or the result of a tool that delivers new inputs."""
        if is_input(message):
            return True
        return isinstance(message, ToolMessage) and message.name in self._tools

    def stated_number(self, message: BaseMessage) -> int | None:
        """The number the message states for itself, or None (no match, an empty or
        non-numeric group, or a number too big to store)."""
        if self._pattern is None:
            return None
        match = self._pattern.search(text_of(message))
        if match is None:
            return None
        try:
            number = int(match.group(1))
        except (TypeError, ValueError):  # the group did not take part, or is not a number
            return None
        return number if 0 <= number <= LARGEST_ITEM else None

    def number(self, message: BaseMessage, last_item: int) -> int:
        """The item a new input starts: its stated number, else the one after ``last_item``."""
        stated = self.stated_number(message)
        return stated if stated is not None else last_item + 1


def numeric_group_problem(pattern: re.Pattern[str]) -> str | None:
    """Why the first capture group of ``pattern`` may capture something that is not a whole
    number (letters, an empty string, a sign), or None when it only ever captures digits.

    Read from the compiled pattern's parse tree, so ``KeeperConfig`` refuses ``r"Item (\\w+)"``
    when it is made, not at the first input that happens to put a word there.
    """
    from re import _parser  # type: ignore[attr-defined]  # the stdlib's own regex parser

    tree = _parser.parse(pattern.pattern, pattern.flags)
    group = _find_group(list(tree), 1)
    if group is None:
        return "it has no first capture group"
    if group.getwidth()[0] < 1:
        return "its first group can capture an empty string"
    if not _digits_only(list(group)):
        return "its first group can capture characters that are not digits"
    return None


def _find_group(items: list[tuple[Any, Any]], number: int) -> Any:
    """The parse tree of capture group ``number`` among ``items`` (searched depth first)."""
    for op, av in items:
        name = str(op)
        if name == "SUBPATTERN":
            if av[0] == number:
                return av[3]
            found = _find_group(list(av[3]), number)
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            found = _find_group(list(av[2]), number)
        elif name == "BRANCH":
            found = next(
                (f for b in av[1] if (f := _find_group(list(b), number)) is not None), None
            )
        elif name in ("ASSERT", "ASSERT_NOT", "ATOMIC_GROUP"):
            found = _find_group(list(av[1] if name != "ATOMIC_GROUP" else av), number)
        else:
            found = None
        if found is not None:
            return found
    return None


_DIGITS = range(ord("0"), ord("9") + 1)


def _digits_only(items: list[tuple[Any, Any]]) -> bool:
    """Whether every character these parse-tree items can match is a decimal digit."""
    for op, av in items:
        name = str(op)
        if name == "LITERAL":
            ok = av in _DIGITS
        elif name == "IN":
            ok = all(_digit_class(str(o), a) for o, a in av)
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            ok = _digits_only(list(av[2]))
        elif name == "SUBPATTERN":
            ok = _digits_only(list(av[3]))
        elif name == "ATOMIC_GROUP":
            ok = _digits_only(list(av))
        elif name == "BRANCH":
            ok = all(_digits_only(list(branch)) for branch in av[1])
        elif name in ("AT", "ASSERT", "ASSERT_NOT"):
            ok = True  # anchors and lookarounds capture nothing
        else:
            ok = False  # any character, a backreference, a negated class: not only digits
        if not ok:
            return False
    return True


def _digit_class(op: str, av: Any) -> bool:
    if op == "CATEGORY":
        return str(av) == "CATEGORY_DIGIT"
    if op == "LITERAL":
        return bool(av in _DIGITS)
    if op == "RANGE":
        return bool(av[0] in _DIGITS and av[1] in _DIGITS)
    return False
