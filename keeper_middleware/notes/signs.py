"""Which sign an amount has where the text states it, and which way its sentence moves a value.

The amounts check finds every amount of a working in the text, whatever its sign, so a model
that reads "recorded domo86 at 342" as -342, or "ten were taken" as +10, passes it: every number
it used is in the text. Measured with a reader that misread one sign in three notes requests,
the notes held ten wrong lines and no check asked again. These pure functions give the sign
check what it needs: the signs each amount is stated with in sentences that state a value, and
the direction (add, take, set) of the sentences that move a value by an amount.

The verbs are plain English ("took", "were taken", "removed", "added", "gained", "recorded at",
"set to"); a sentence with verbs of two directions, or none, says nothing about direction, so
the check stays silent rather than guess.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import lru_cache
from typing import Literal

from keeper_middleware.notes.numbers import (
    FIRST_LETTERS,
    SHORT_TEXT,
    SHORT_TEXTS_KEPT,
    parse_number,
    words_to_int,
)

Direction = Literal["add", "take", "set"]

_VERBS: dict[Direction, re.Pattern[str]] = {
    "take": re.compile(
        r"\b(?:took|take|takes|taking|taken|removed?|removes|removing|subtract(?:ed|s)?|"
        r"deduct(?:ed|s)?|withdr[ea]w[ns]?|withdrawn|lost|loses?|losing|spent|spends?|debited|"
        r"dropped|fell|decreased|reduced|lowered|paid out)\b",
    ),
    "add": re.compile(
        r"\b(?:added|adds?|adding|gave|gives?|given|giving|deposit(?:ed|s)?|gained|gains?|"
        r"regained|received|receives?|rose|raised|increased|topped up|put in|put into|"
        r"put \S+ more|credited)\b",
    ),
    "set": re.compile(
        r"\b(?:recorded|records?|logged|logs?|set|sets|reset|stood at|stands at|stand at|"
        r"registered|noted at|counted at|brought)\b",
    ),
}
_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+|\n+")
_SIGNED_DIGITS = re.compile(r"(?<![\w.])[-−]?\d[\d,]*(?:\.\d+)?(?![\w])")
_NUMBER_WORD = (
    r"zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|"
    r"fifteen|sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|"
    r"eighty|ninety|hundred|thousand|million|billion"
)
_SIGNED_WORDS = re.compile(
    rf"\b(?=[{FIRST_LETTERS}])(?:(?:minus|negative)\s+)?(?:{_NUMBER_WORD})(?:[\s-]+(?:and[\s-]+)?(?:{_NUMBER_WORD}))*\b",
    re.IGNORECASE,
)
_MINUS_BEFORE = re.compile(r"(?:minus|negative)\s*$", re.IGNORECASE)


def sentences(text: str) -> Iterator[str]:
    """The text's sentences (a line break ends one too), stripped, empty ones skipped."""
    for sentence in _SENTENCE_END.split(text):
        stripped = sentence.strip()
        if stripped:
            yield stripped


def sentence_direction(sentence: str) -> Direction | Literal["mixed"] | None:
    """The one direction the sentence's verbs give; "mixed" for several, None for no such verb.

    Verbs are matched in lower case only (the sentence's first letter lowered), so a name that
    is also a verb ("Yara Fell put 8 more into it") is not read as one."""
    lowered = sentence[:1].lower() + sentence[1:]
    found: list[Direction] = [d for d, verb in _VERBS.items() if verb.search(lowered)]
    if not found:
        return None
    return found[0] if len(found) == 1 else "mixed"


def _signed_amounts(text: str) -> Iterator[tuple[int, float]]:
    """(position, amount) of every amount in the text, with the sign it is written with."""
    for match in _SIGNED_DIGITS.finditer(text):
        value = parse_number(match.group())
        if value is not None:
            negative_word = _minus_before(text, match.start())
            yield match.start(), -abs(value) if negative_word else value
    for match in _SIGNED_WORDS.finditer(text):
        value = words_to_int(match.group())
        if value is not None:
            yield match.start(), float(value)


def _minus_before(text: str, end: int) -> bool:
    """Whether "minus" or "negative" (then blanks) ends ``text[:end]``: the pattern is tried on
    the few characters before the blanks only, not on the whole text before every amount."""
    while end and text[end - 1].isspace():
        end -= 1
    return _MINUS_BEFORE.search(text, max(0, end - len("negative")), end) is not None


def signed_amounts_in(text: str) -> frozenset[float]:
    """Every amount the text states, with the sign it is written with ("minus six" → -6).

    A short text (a STATE value, a rule) is read once and remembered: every
    cut's checks read every value the NOTES hold, and the same values come back cut after cut.
    """
    if len(text) <= SHORT_TEXT:
        return _short_signed_amounts(text)
    return _scan_signed_amounts(text)


def _scan_signed_amounts(text: str) -> frozenset[float]:
    return frozenset(amount for _, amount in _signed_amounts(text))


_short_signed_amounts = lru_cache(maxsize=SHORT_TEXTS_KEPT)(_scan_signed_amounts)


def first_amount(text: str) -> float | None:
    """The first amount the text states, with its sign; None when it states none."""
    return min(_signed_amounts(text), default=(0, None))[1]


SentenceFacts = tuple[tuple[Direction | Literal["mixed"] | None, frozenset[float]], ...]
"""Each sentence's direction and the signed amounts it states, in order."""


@lru_cache(maxsize=4)
def sentence_facts(text: str) -> SentenceFacts:
    """Each sentence's direction and signed amounts, read in one pass over the text.

    The sign check needs both the value statements and the directions of the same noted text;
    reading its sentences once for both halves the work of a cut's checks over the turns (the
    biggest part of what a cut costs the keeper). Only the last few texts are kept: a cut's
    checks all read the same one. The sentences are read afresh, not remembered with the
    short texts (they would push out the NOTES' values, which come back every cut).
    """
    return tuple(
        (sentence_direction(sentence), _scan_signed_amounts(sentence))
        for sentence in sentences(text)
    )


@lru_cache(maxsize=64)
def value_statements(text: str) -> frozenset[float]:
    """Signed amounts stated as values: in sentences that set a value or have no verb that moves
    one ("recorded domo86 at 342", "It was 342."), not in those that add or take an amount."""
    found: set[float] = set()
    for direction, amounts in sentence_facts(text):
        if direction in ("set", None):
            found |= amounts
    return frozenset(found)


@lru_cache(maxsize=64)
def amount_directions(text: str) -> dict[float, frozenset[str]]:
    """For each amount (absolute value) the text states, the directions of its sentences."""
    directions: dict[float, set[str]] = {}
    for direction, amounts in sentence_facts(text):
        for amount in amounts:
            directions.setdefault(abs(amount), set()).add(direction or "none")
    return {amount: frozenset(found) for amount, found in directions.items()}


def _flatten(node: ast.expr) -> Iterator[tuple[ast.expr, int]]:
    """The terms of a sum, left to right, with the sign each enters it with. A product or a
    quotient is one term, and so is a parenthesised sum on the right ("- (342 - 10)"): that is
    another counter's working, whose inner signs are not this line's."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub):
        yield from _flatten(node.left)
        yield node.right, 1 if isinstance(node.op, ast.Add) else -1
    else:
        yield node, 1


def _plain_amount(node: ast.expr) -> float | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        inner = _plain_amount(node.operand)
        if inner is None:
            return None
        return -inner if isinstance(node.op, ast.USub) else inner
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return float(node.value)
    return None


def sum_terms(expression: str) -> list[float | None]:
    """The signed terms of a working's top-level sum, in order: "342 - 10 + 3 * 2" → [342, -10,
    None]. A term that is not a plain amount (a product, a parenthesised group, another counter's
    own working) is None: the sign of what it stands for is not the text's to check. A working
    that is not arithmetic gives []."""
    try:
        tree = ast.parse(expression, mode="eval")
    except (SyntaxError, ValueError):
        return []
    terms: list[float | None] = []
    for node, sign in _flatten(tree.body):
        amount = _plain_amount(node)
        terms.append(None if amount is None else sign * amount)
    return terms
