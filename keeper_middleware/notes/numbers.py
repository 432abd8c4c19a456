"""Numbers written the ways people write them: digits and English number words.

The notes checks must find "342" in "three hundred and forty-two", and the benchmark writes
amounts both ways, so reading and writing number words lives in one place.
"""

from __future__ import annotations

import re
from functools import lru_cache

_UNITS = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
_TENS = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_SCALES = [(1_000_000_000, "billion"), (1_000_000, "million"), (1_000, "thousand")]
_WORD_VALUE = {w: i for i, w in enumerate(_UNITS)} | {
    w: 10 * i for i, w in enumerate(_TENS) if w != "_"
}
_SCALE_VALUE = {"hundred": 100, "thousand": 1_000, "million": 1_000_000, "billion": 1_000_000_000}
_NUMBER_WORDS = set(_WORD_VALUE) | set(_SCALE_VALUE) | {"and", "minus", "negative"}

_DIGITS = re.compile(r"(?<![\w.])[-−]?\d[\d,]*(?:\.\d+)?(?![\w])")
FIRST_LETTERS = "".join(
    sorted({word[0] for word in (*_WORD_VALUE, *_SCALE_VALUE, "minus", "negative")})
)
"""The letters a number word (or "minus", "negative") starts with: checked before the long
alternation, so the scan skips every other word at once (twice as fast on English prose)."""
_WORD_RUN = re.compile(
    rf"\b(?=[{FIRST_LETTERS}])(?:(?:minus|negative)\s+)?(?:"
    + "|".join(sorted(set(_WORD_VALUE) | set(_SCALE_VALUE), key=len, reverse=True))
    + r")(?:[\s-]+(?:and[\s-]+)?(?:"
    + "|".join(sorted(set(_WORD_VALUE) | set(_SCALE_VALUE), key=len, reverse=True))
    + r"))*\b",
    re.IGNORECASE,
)


def to_words(n: int) -> str:
    """Write ``n`` in British-style words: 342 → "three hundred and forty-two"."""
    if n < 0:
        return "minus " + to_words(-n)
    if n < 20:
        return _UNITS[n]
    if n < 100:
        tens, unit = divmod(n, 10)
        return _TENS[tens] + ("-" + _UNITS[unit] if unit else "")
    if n < 1000:
        hundreds, rest = divmod(n, 100)
        head = _UNITS[hundreds] + " hundred"
        return head + (" and " + to_words(rest) if rest else "")
    for scale, name in _SCALES:
        if n >= scale:
            high, rest = divmod(n, scale)
            head = to_words(high) + " " + name
            if not rest:
                return head
            return head + (" and " if rest < 100 else " ") + to_words(rest)
    raise AssertionError("unreachable")


def words_to_int(text: str) -> int | None:
    """Read number words ("three hundred and forty-two", "minus six") as an int, else None."""
    tokens = [t for t in re.split(r"[\s-]+", text.strip().lower()) if t]
    if not tokens or any(t not in _NUMBER_WORDS for t in tokens):
        return None
    sign = 1
    if tokens[0] in ("minus", "negative"):
        sign, tokens = -1, tokens[1:]
    total = current = 0
    seen = False
    for token in tokens:
        if token == "and":
            continue
        seen = True
        if token in _WORD_VALUE:
            current += _WORD_VALUE[token]
        elif token == "hundred":
            current = (current or 1) * 100
        else:
            total += (current or 1) * _SCALE_VALUE[token]
            current = 0
    return sign * (total + current) if seen else None


def parse_number(text: str) -> float | None:
    """Read one amount written in digits ("1,204", "-7", "3.5") or words; None if it is neither."""
    cleaned = text.strip().replace("−", "-")
    try:
        return float(cleaned.replace(",", ""))
    except ValueError:
        pass
    value = words_to_int(cleaned)
    return None if value is None else float(value)


SHORT_TEXT = 400
"""Texts this long or shorter (a STATE value, a rule, a sentence) are read once and
remembered; longer ones (the noted turns) only while a cut's checks read them."""
SHORT_TEXTS_KEPT = 4_096
"""How many short texts are remembered: ten times the entries the NOTES hold at a 32K window
(300–400), so the values the NOTES keep are not read again every cut."""


def amounts_in(text: str) -> set[float]:
    """Every amount a text states (see :func:`_scan_amounts`); a fresh set the caller may change."""
    if len(text) <= SHORT_TEXT:
        return set(_short_amounts(text))
    return set(_amounts_in(text))


def _scan_amounts(text: str) -> frozenset[float]:
    """Every amount a text states, in digits or in words (both signs of a bare amount count).

    "ten were taken" states 10; whether it is added or taken is the sentence's business, so the
    checks accept either sign for an amount that appears in the text.
    """
    found: set[float] = set()
    for match in _DIGITS.finditer(text):
        value = parse_number(match.group())
        if value is not None:
            found.add(abs(value))
    for match in _WORD_RUN.finditer(text):
        value = words_to_int(match.group())
        if value is not None:
            found.add(float(abs(value)))
    return frozenset(found)


_amounts_in = lru_cache(maxsize=64)(_scan_amounts)
_short_amounts = lru_cache(maxsize=SHORT_TEXTS_KEPT)(_scan_amounts)


def format_number(value: float) -> str:
    """Render a computed amount the way notes store it: 332, not 332.0."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
