"""A noted value must follow what the turns say about its key: the program re-reads the batch.

The other amount checks ask whether an amount is in the turns at all. A misread passes them when
the amount it takes is in the turns but about another name ("took 13 from domo86" noted as 23,
the amount the next sentence takes from kilo12), when a change is skimmed past (the working
leaves out "took 25 from domo86"), or when the value the NOTES hold is read wrong (the working
starts from -357 or from another entry's value where the NOTES hold domo86 = 357). Each such
line is then replayed by every later answer, so it is worth a second reading before it enters
the NOTES. The keeper has the turns word for word, so it can tell which amounts they state about
a key: the sentences that name it, and the sentences right after them that go on speaking of it
("it", "its", "that") and name no other key.

What a line's working is compared with:

- it starts from the value the NOTES hold for the key, or from an amount the turns state about
  it (a value set outright);
- each amount it adds or takes is stated about the key (or is another entry's value: a change
  by as much as another counter held);
- every amount stated about the key after the one it starts from is used: a change left out
  keeps an old value. A line with no working whose value is stated about the key must be the
  last amount stated about it, and a line that keeps the value the NOTES hold must not have any
  amount stated about it.

Only questioned, never left out (``keep_if_unresolved``): wording no check can follow ("that
should have read 30", a change told over two batches) can make a right line look wrong, so a
line stays when a second reading does not give one that passes. Keys the turns never name are
not judged (their change came from text already noted, or from an open entry).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from keeper_middleware.notes.changes import Change, SetLine
from keeper_middleware.notes.checks.amounts import known_amounts, normalise_working
from keeper_middleware.notes.checks.base import CheckContext, Issue
from keeper_middleware.notes.numbers import amounts_in, format_number, parse_number
from keeper_middleware.notes.signs import sentences, sum_terms
from keeper_middleware.retrievers.passages import REFERRING

_WORD = re.compile(r"\w+")
_ONE_NAME = re.compile(r"\w[\w.-]*")
_GOES_ON = REFERRING | {"that"}
_CORRECTS = re.compile(r"\b(?:correct\w*|should have|instead|rather|mistake\w*)\b", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class _Stated:
    """What the turns state about one key: its amounts in reading order, and whether a sentence
    about it corrects an earlier one (then the order of amounts proves nothing)."""

    amounts: tuple[float, ...]
    corrected: bool


def _names_in(sentence: str, keys: frozenset[str]) -> set[str]:
    return {word.casefold() for word in _WORD.findall(sentence)} & keys


def stated_about(text: str, keys: frozenset[str]) -> dict[str, _Stated]:
    """The amounts ``text`` states about each of ``keys`` (case folded): from each sentence that
    names keys, and from the sentences after it that go on speaking of the one key it named."""
    return _read(text, keys)[0]


def _read(text: str, keys: frozenset[str]) -> tuple[dict[str, _Stated], frozenset[float]]:
    """`stated_about`, and the amounts of the sentences that speak of no key (a value whose key
    an earlier sentence named: "the recount begun in the previous item came to 926")."""
    amounts: dict[str, list[float]] = {}
    loose: set[float] = set()
    corrected: set[str] = set()
    current: str | None = None
    for sentence in sentences(text):
        if sentence.rstrip().endswith("?"):
            current = None
            continue
        named = _names_in(sentence, keys)
        if named:
            about = named
            current = next(iter(named)) if len(named) == 1 else None
        elif current is not None and {w.lower() for w in _WORD.findall(sentence)} & _GOES_ON:
            about = {current}
            if _CORRECTS.search(sentence):
                corrected.add(current)
        else:
            current = None
            loose |= amounts_in(sentence)
            continue
        found = sorted(amounts_in(sentence), key=lambda amount: sentence.find(_plain(amount)))
        for key in about:
            amounts.setdefault(key, []).extend(found)
    stated = {
        key: _Stated(tuple(found), key in corrected) for key, found in amounts.items() if found
    }
    return stated, frozenset(loose)


def _plain(amount: float) -> str:
    return format_number(amount)


def _held_values(context: CheckContext) -> dict[str, float]:
    held: dict[str, float] = {}
    for key, value in context.notes.state:
        number = parse_number(value.split("(")[0])
        if number is not None:
            held[key.casefold()] = number
    return held


def _issue(line: SetLine, reason: str, check: str) -> Issue:
    return Issue(line.render(), reason, check, "keep_if_unresolved")


@dataclass(frozen=True, slots=True)
class WorkingFollowsText:
    """A line's working starts from the noted value, uses the amounts the turns state about its
    key and leaves none of them out (see the module docstring)."""

    name: str = field(default="working_follows_text", init=False)

    def check(self, changes: Sequence[Change], context: CheckContext) -> list[Issue]:
        lines = [c for c in changes if isinstance(c, SetLine) and _ONE_NAME.fullmatch(c.key)]
        if not lines:
            return []
        keys = frozenset(
            [key.casefold() for key, _ in context.notes.state if _ONE_NAME.fullmatch(key)]
            + [line.key.casefold() for line in lines]
        )
        stated, loose = _read(context.noted_text, keys)
        held = _held_values(context)
        known = known_amounts(context)
        issues: list[Issue] = []
        for line in lines:
            about = stated.get(line.key.casefold())
            if about is None or (line.working is None and parse_number(line.value) in loose):
                continue  # nothing said about it, or a value told without its key's name
            reason = self._reason(line, about, held, known - loose)
            if reason is not None:
                issues.append(_issue(line, reason, self.name))
        return issues

    def _reason(
        self, line: SetLine, about: _Stated, held: dict[str, float], known: set[float]
    ) -> str | None:
        """Why the line does not follow the text, or None. ``known``: the amounts of the turns
        and the NOTES that may be about another key; an amount found nowhere is left to
        ``AmountsInText`` (which questions it already), and one stated in a sentence that names
        no key may be this key's (a recount's result), so neither is judged here."""
        key = line.key.casefold()
        noted = held.get(key)
        said = about.amounts
        if line.working is None:
            value = parse_number(line.value)
            if value is None:
                return None
            if value in said:
                later = said[len(said) - 1 - said[::-1].index(value) + 1 :]
                if later and not about.corrected:
                    amounts = ", ".join(format_number(a) for a in later)
                    return f"the turns state {amounts} about {line.key} after {line.value}"
                return None
            if noted is not None and value == noted:
                amounts = ", ".join(format_number(a) for a in said)
                return (
                    f"the turns state {amounts} about {line.key}, and the line keeps the value "
                    "the NOTES hold"
                )
            return None
        terms = sum_terms(normalise_working(line.working).split("=")[0].strip())
        if not terms or terms[0] is None:
            return None
        start = terms[0]
        if abs(start) not in known and start not in said and abs(start) not in said:
            return None  # a value told without its key's name: not the text's to check
        if start not in said and abs(start) not in said and start != noted:
            shown = "no value" if noted is None else format_number(noted)
            return (
                f"the working starts from {format_number(start)}, but the NOTES hold "
                f"{shown} for {line.key} and the turns do not state it"
            )
        if any(term is None for term in terms[1:]):
            return None  # another entry's value or a product: not the text's to check
        others = {value for name, value in held.items() if name != key}
        used = [abs(term) for term in terms[1:] if term is not None]
        foreign = [a for a in used if a not in said and a not in others and a in known]
        if foreign:
            return (
                f"the amount {format_number(foreign[0])} is not stated about {line.key} in "
                "the turns"
            )
        if about.corrected:
            return None
        after = list(said)
        if start in said or abs(start) in said:
            first = start if start in said else abs(start)
            after = list(said[len(said) - said[::-1].index(first) :])
        missing = Counter(after) - Counter(used)
        if missing:
            amounts = ", ".join(format_number(a) for a in missing)
            return f"the turns state {amounts} about {line.key}, and the working does not use it"
        return None
