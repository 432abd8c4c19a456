"""The content's own numbering: which item (batch, ticket) each new input is.

Search results and notes count only in these numbers, never in message indices: mixing the two
numberings cost a measured run thirteen answers.

Real numbering is not always tidy: a ticket queue restarts, an import jumps from "Item 999" to
"Item 21", a heading quotes a number no integer column can hold. None of that may raise: a
number is taken as stated when it is a whole number an archive can store, and ignored (the
input gets the next number) when it is not.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import BaseMessage, ToolMessage

from keeper_middleware.messages.facts import is_input, text_of

log = logging.getLogger(__name__)

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


LEARNED_HEAD = "item_head"
"""The keeper's state key holding the head word learned from a session's inputs (or absent)."""

HEAD_SEEN = "item_head_seen"
"""The keeper's state key holding the last content input's head: its word, its number, and the
item the keeper gave it while no head was known."""

_HEAD = re.compile(r"\A\s*([^\W\d_]+)\s+#?(\d+)\b")
"""A head an input may open with: one word of letters, then a number ("Entry 12.", "Day 3",
"Log #40")."""


@dataclass(slots=True)
class Counting:
    """Where one session's numbering stands; kept in the keeper's state between steps."""

    last_item: int = 0
    numbered: bool = False
    """An input has stated its number: from then on a question joins the item before it."""
    head: str | None = None
    """The head word learned from the inputs ("Entry"), once two in a row rose by one."""
    seen: tuple[str, int, int] | None = None
    """The last content input's head (word, number, item given), while none is learned."""

    @classmethod
    def load(cls, state: Mapping[str, Any]) -> Counting:
        seen = state.get(HEAD_SEEN)
        head = state.get(LEARNED_HEAD)
        return cls(
            last_item=int(state.get("last_item", 0)),
            numbered=bool(state.get("numbered", False)),
            head=str(head) if head else None,
            seen=(str(seen[0]), int(seen[1]), int(seen[2])) if seen else None,
        )

    def save(self, state: MutableMapping[str, Any]) -> None:
        state["last_item"] = self.last_item
        state["numbered"] = self.numbered
        for key, value in ((LEARNED_HEAD, self.head), (HEAD_SEEN, self.seen)):
            if value is None:
                state.pop(key, None)
            else:
                state[key] = list(value) if isinstance(value, tuple) else value


@dataclass(frozen=True, slots=True)
class Taken:
    """What numbering one new input did."""

    new_item: bool
    """The input began an item (it counts toward the notes cadence)."""
    renumber: tuple[int, int] | None = None
    """(from, to): the head was learned at this input, so messages given item ``from`` or later
    belong to item ``to``, the number the input before stated."""


class ItemNumbering:
    """Gives each new input its item number: the one it states, or the next one.

    A stated number is what ``pattern`` captures; when it has never matched in a session and
    ``learn`` is on, a head is learned from the inputs themselves: two content inputs in a row
    (questions aside) that open with the same word and a number one higher ("Entry 4.", then
    "Entry 5.") make that word the session's head, and from then on the inputs count in its
    numbers, as with a matching ``pattern``. One head alone is not enough (a message may open
    "Page 2 of the report"); a number that rises by one, input after input, is a numbering.
    """

    __slots__ = ("_learn", "_pattern", "_tools")

    def __init__(
        self, pattern: str | None, item_tools: Sequence[str] = (), *, learn: bool = True
    ) -> None:
        self._pattern = re.compile(pattern, re.MULTILINE) if pattern else None
        self._tools = frozenset(item_tools)
        self._learn = learn and self._pattern is not None

    def is_new_input(self, message: BaseMessage) -> bool:
        """A user message, or the result of a tool that delivers new inputs."""
        if is_input(message):
            return True
        return isinstance(message, ToolMessage) and message.name in self._tools

    def stated_number(self, message: BaseMessage, head: str | None = None) -> int | None:
        """The number the message states for itself, or None (no match, an empty or
        non-numeric group, or a number too big to store). ``head``: a head word learned from
        the session's inputs, read when the pattern does not match."""
        if self._pattern is None:
            return None
        text = text_of(message)
        number = _number(self._pattern.search(text))
        if number is None and head is not None:
            found = _HEAD.match(text)
            number = _number(found, 2) if found is not None and found.group(1) == head else None
        return number

    def number(self, message: BaseMessage, last_item: int) -> int:
        """The item a new input starts: its stated number, else the one after ``last_item``."""
        stated = self.stated_number(message)
        return stated if stated is not None else last_item + 1

    def take(self, counting: Counting, message: BaseMessage, *, question: bool) -> Taken:
        """Number one new input, updating ``counting``: its stated number (by the pattern or
        the learned head), else the next one; a question joins the item before it once the
        inputs state their numbers (before that, with nothing to count by, it is an item of its
        own, so a question can still set off the cadence's cut)."""
        stated = self.stated_number(message, counting.head)
        if stated is not None:
            # a number that restarts, jumps or goes back is one more item all the same
            new_item = stated != counting.last_item
            counting.last_item, counting.numbered = stated, True
            return Taken(new_item)
        if self._learn and not counting.numbered and not question:
            learned = self._learn_head(counting, text_of(message))
            if learned is not None:
                return learned
        if counting.numbered and question:
            return Taken(False)
        counting.last_item += 1
        return Taken(True)

    def _learn_head(self, counting: Counting, text: str) -> Taken | None:
        """Learn the head when this content input's continues the one before by one."""
        found = _HEAD.match(text)
        number = _number(found, 2)
        if found is None or number is None:
            counting.seen = None
            return None
        word, before = found.group(1), counting.seen
        if before is None or before[0] != word or before[1] + 1 != number:
            counting.seen = (word, number, counting.last_item + 1)
            return None
        _, stated_before, given_before = before
        log.info("item heads learned: inputs open %r and a number rising by one", word)
        counting.head, counting.seen = word, None
        counting.last_item, counting.numbered = number, True
        moved = given_before != stated_before
        return Taken(True, (given_before, stated_before) if moved else None)


def renumber(items: MutableMapping[str, int], moved: tuple[int, int] | None) -> None:
    """Give the messages of item ``moved[0]`` or later item ``moved[1]`` (a learned head: the
    input before was numbered by the keeper, and stated its own number)."""
    if moved is None:
        return
    first, to = moved
    for msg_id, item in items.items():
        if item >= first:
            items[msg_id] = to


def _number(match: re.Match[str] | None, group: int = 1) -> int | None:
    """The whole number a match's ``group`` holds, when an archive can store it."""
    if match is None:
        return None
    try:
        number = int(match.group(group))
    except (TypeError, ValueError):  # the group did not take part, or is not a number
        return None
    return number if 0 <= number <= LARGEST_ITEM else None


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
