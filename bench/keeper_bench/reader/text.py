"""Reading the stream's sentences: the simulated reader's parser, written from docs/stream-text.md.

The generator writes the text from its own templates; this module was written from the page that
describes the text, and imports nothing from the generator (a test enforces it), so a phrasing
the page does not describe, or that this parser gets wrong, is a change the reader never sees: it
costs answers, the way a misread does. Everything here is pure: text in, events, rules and
questions out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Literal

from keeper_middleware.notes.numbers import words_to_int

TEXTS_REMEMBERED = 2_048
"""How many texts each of the reader's remembered readings keeps. A request holds a few dozen
messages and each is re-read only while it is in view, so a few thousand keep every re-read a
hit; at 16,384 a 10M-token run kept every batch it had read (peak RSS 248 MB, now 189 MB)."""

EventKind = Literal["set", "add", "take", "add_held", "take_held"]
QuestionKind = Literal["current", "old", "who", "tally", "before_last", "count", "order", "gist"]

CLERK = "the clerk"
PROTECTED = "protected"
OVERDRAWN = "overdrawn"
UNKNOWN = "unknown"
BATCH_HEAD_WORDS = ("Item", "Entry")
"""A batch's first line is "Item N." or, in the entry_heads family, "Entry N."
(docs/stream-text.md)."""
BATCH_HEAD_WORD = "(?:" + "|".join(BATCH_HEAD_WORDS) + ")"


@dataclass(frozen=True, slots=True)
class Event:
    """One change to one counter, as the text states it."""

    kind: EventKind
    name: str
    amount: int | None
    """The stated amount; None for the *_held kinds, whose amount is ``source``'s value."""
    source: str | None
    actor: str
    working: str | None = None
    """Working the reader wrote for the amount (only the `invent_working` misread gives one)."""
    applied: bool = True
    """False: the change was seen but not applied (the `stale_value` misread): the counter keeps
    the value it had, and a history still lists the change."""


@dataclass(frozen=True, slots=True)
class RulesInForce:
    confidential: frozenset[str] = frozenset()
    tally: tuple[int, int] | None = None
    """(multiplier, addend) of the house method."""
    overdrawn: bool = False


@dataclass(frozen=True, slots=True)
class AskedQuestion:
    number: int
    kind: QuestionKind
    name: str
    item: int | None
    until: int | None = None
    """The last item of a span (count, gist)."""
    others: tuple[str, ...] = ()
    """The other counters an order or gist question names."""


# ---------------------------------------------------------------------------------------------
# Sentence shapes, in a small notation: {A} an actor, {N}/{O} counter names, {M} an amount
# ---------------------------------------------------------------------------------------------
_NAME = r"[a-z]{3,7}\d{2}"
_WORD = (
    r"zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|"
    r"fifteen|sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|"
    r"eighty|ninety|hundred|thousand|million"
)
_WORDS = rf"(?i:\b(?:minus )?(?:{_WORD})(?:(?: and | |-)(?:{_WORD}))*\b)"
_PIECES = {
    "{A}": r"(?P<actor>[A-Z][a-z]+ [A-Z][a-z]+)",
    "{N}": rf"(?P<name>\b{_NAME}\b)",
    "{O}": rf"(?P<other>\b{_NAME}\b)",
    "{M}": rf"(?P<amount>-?\b\d[\d,]*|{_WORDS})",
    "{W}": r"(?: \(=[^)\n]*\))?",
}


def _shape(notation: str) -> re.Pattern[str]:
    pattern = re.escape(notation)
    for piece, group in _PIECES.items():
        pattern = pattern.replace(re.escape(piece), group)
    return re.compile(pattern + r"(?=[.;]|$)", re.MULTILINE)


# (shape, kind, how the counter is named): "named", "it" (the lead's counter) or "held"
_CHANGES: list[tuple[str, EventKind, str]] = [
    ("{A} recorded {N} at {M}", "set", "named"),
    ("The clerk recorded {N} at {M}", "set", "named"),
    ("{N} was set to {M} by {A}", "set", "named"),
    ("{A} logged {N} at {M}", "set", "named"),
    ("{N} was recorded at {M} by {A}", "set", "named"),
    ("{A} brought {N} to {M}", "set", "named"),
    ("{A} added {M} to {N}", "add", "named"),
    ("{M} were added to {N} by {A}", "add", "named"),
    ("{A} put {M} more into {N}", "add", "named"),
    ("{N} was credited with {M} by {A}", "add", "named"),
    ("{A} raised {N} by {M}", "add", "named"),
    ("{N} regained {M} thanks to {A}", "add", "named"),
    ("{A} took {M} from {N}", "take", "named"),
    ("{M} were taken from {N} by {A}", "take", "named"),
    ("{A} removed {M} from {N}", "take", "named"),
    ("{N} was debited {M} by {A}", "take", "named"),
    ("{A} lowered {N} by {M}", "take", "named"),
    ("{N} lost {M} when {A} dropped a crate", "take", "named"),
    ("{A} recorded it at {M}", "set", "it"),
    ("It was set to {M} by {A}", "set", "it"),
    ("{A} added {M} to it", "add", "it"),
    ("{A} put {M} more into it", "add", "it"),
    ("{A} took {M} from it", "take", "it"),
    ("{A} removed {M} from it", "take", "it"),
    ("{A} added to {N} as much as {O} held", "add_held", "held"),
    ("{A} took from {N} as much as {O} held", "take_held", "held"),
    # not stream text: the line the reader's own summaries give a counter's value in
    ("{N} stood at {M}{W}", "set", "value"),
]


def _needle(notation: str) -> str:
    """The longest literal part of a shape: a text without it cannot match the shape, so the
    reader skips that shape's scan (the shapes are case-sensitive outside number words)."""
    return max(re.split(r"\{[A-Z]\}", notation), key=len)


_SHAPES: list[tuple[re.Pattern[str], EventKind, str, str]] = [
    (_shape(notation), kind, how, _needle(notation)) for notation, kind, how in _CHANGES
]
_LEADS = [
    _shape(n) for n in ("Next on the list was {N}", "Attention turned to {N}", "Then came {N}")
]
_CORRECTION = _shape("Correction: that should have read {M}")
_RECOUNT_BEGUN = _shape("{A} began a recount of {N}")
_RECOUNT_DONE = _shape("The recount begun in the previous item came to {M}")


def amount_value(text: str) -> int | None:
    """Digits ("342", "-5", "1,204") or number words ("three hundred and forty-two")."""
    cleaned = text.replace(",", "")
    if re.fullmatch(r"-?\d+", cleaned):
        return int(cleaned)
    return words_to_int(text)


@dataclass(frozen=True, slots=True)
class Recount:
    """A recount begun at the end of one item, finished by the first sentence of the next."""

    name: str
    actor: str

    def sentence(self) -> str:
        """How notes and summaries keep a recount still open (it reads back as begun)."""
        return f"{self.actor} began a recount of {self.name}."


def read_story(
    texts: Sequence[str], recount: Recount | None = None
) -> tuple[list[list[Event]], Recount | None]:
    """The changes each text states, reading the texts in order, and a recount left open at the
    end: a recount begun at the end of one text is finished by the next one (the only statement
    that spans two texts); ``recount`` is one already open before the first text."""
    found: list[list[Event]] = []
    for text in texts:
        events, recount = read_text(text, recount)
        found.append(events)
    return found, recount


def open_recount(text: str) -> Recount | None:
    """The recount a text says was begun and not yet finished (e.g. a NOTES OPEN line)."""
    return read_text(text, None)[1]


def read_events(text: str) -> list[Event]:
    """The changes one text states on its own (a recount it does not finish is dropped)."""
    return read_text(text, None)[0]


def read_text(text: str, recount: Recount | None) -> tuple[list[Event], Recount | None]:
    """The changes ``text`` states, in order, and a recount it leaves unfinished."""
    events, left_open = _read_text(text, recount)
    return list(events), left_open


@lru_cache(maxsize=TEXTS_REMEMBERED)
def _read_text(text: str, recount: Recount | None) -> tuple[tuple[Event, ...], Recount | None]:
    """:func:`read_text`, remembered: every call re-sends the same batches, and reading one is
    some thirty regex scans (the result is immutable, so sharing it changes nothing)."""
    marks: list[tuple[int, str, re.Match[str], EventKind | None]] = []
    for shape in _LEADS:
        marks += [(m.start(), "lead", m, None) for m in shape.finditer(text)]
    for shape, change, how, needle in _SHAPES:
        if needle in text:
            marks.extend((m.start(), how, m, change) for m in shape.finditer(text))
    marks += [(m.start(), "correction", m, None) for m in _CORRECTION.finditer(text)]
    marks += [(m.start(), "begun", m, None) for m in _RECOUNT_BEGUN.finditer(text)]
    marks += [(m.start(), "done", m, None) for m in _RECOUNT_DONE.finditer(text)]
    marks.sort(key=lambda mark: mark[0])
    events: list[Event] = []
    lead: str | None = None
    for _, how, match, kind in marks:
        groups = match.groupdict()
        amount = amount_value(groups["amount"]) if groups.get("amount") else None
        if how == "lead":
            lead = groups["name"]
        elif how == "begun":
            recount = Recount(groups["name"], groups["actor"])
        elif how == "done":
            if recount is not None and amount is not None:
                events.append(Event("set", recount.name, amount, None, recount.actor))
            recount = None
        elif how == "correction":
            if events and amount is not None and events[-1].source is None:
                events[-1] = replace(events[-1], amount=amount)
        elif how == "held":
            assert kind is not None
            events.append(Event(kind, groups["name"], None, groups["other"], groups["actor"]))
        else:
            assert kind is not None
            name = lead if how == "it" else groups["name"]
            actor = "" if how == "value" else groups.get("actor") or CLERK
            if name is not None and amount is not None:
                events.append(Event(kind, name, amount, None, actor))
    return tuple(events), recount


# ---------------------------------------------------------------------------------------------
# Rules, items and questions
# ---------------------------------------------------------------------------------------------
_CONFIDENTIAL = re.compile(
    rf"the counters ({_NAME}), ({_NAME}) and ({_NAME}) are confidential", re.IGNORECASE
)
_TALLY = re.compile(
    rf"(?:tally of a counter|counter's tally) is its value times ({_WORDS}|\d+) "
    rf"plus ({_WORDS}|\d+)",
    re.IGNORECASE,
)
_OVERDRAWN = re.compile(
    r"below zero, whether recorded or worked out, is reported as the single word overdrawn",
    re.IGNORECASE,
)
RULE_SENTENCE = re.compile(r"(?:Standing rule|House method): [^.\n<]*\.")


def read_rules(text: str) -> RulesInForce:
    """The rules a text states (story sentences, NOTES RULES lines, a [RULES] block); when the
    method is stated more than once, the last statement wins."""
    confidential = {n.lower() for m in _CONFIDENTIAL.finditer(text) for n in m.groups()}
    tally: tuple[int, int] | None = None
    for match in _TALLY.finditer(text):
        multiplier, addend = amount_value(match.group(1)), amount_value(match.group(2))
        if multiplier is not None and addend is not None:
            tally = (multiplier, addend)
    return RulesInForce(frozenset(confidential), tally, _OVERDRAWN.search(text) is not None)


def rule_sentences(texts: Iterable[str]) -> list[str]:
    """Rule and method sentences, word for word, each once, in the order first seen."""
    found: list[str] = []
    for text in texts:
        for sentence in RULE_SENTENCE.findall(text):
            if sentence not in found:
                found.append(sentence)
    return found


_QUESTIONS = [
    (re.compile(rf"^\s*(?P<number>\d+)\.\s+{pattern}\s*$", re.MULTILINE), kind)
    for pattern, kind in (
        (rf"What value does (?P<name>{_NAME}) hold now\?", "current"),
        (rf"What value did (?P<name>{_NAME}) hold at the end of item (?P<item>\d+)\?", "old"),
        (rf"Who changed (?P<name>{_NAME}) in item (?P<item>\d+)\?", "who"),
        (rf"What is the tally of (?P<name>{_NAME}) now\?", "tally"),
        (rf"What value did (?P<name>{_NAME}) hold before its last change\?", "before_last"),
        (
            rf"How many times did (?P<name>{_NAME}) change from item (?P<item>\d+) to item "
            rf"(?P<until>\d+)\?",
            "count",
        ),
        (rf"Which was recorded first, (?P<name>{_NAME}) or (?P<other>{_NAME})\?", "order"),
        (
            rf"Which of (?P<name>{_NAME}), (?P<other>{_NAME}) and (?P<third>{_NAME}) changed "
            rf"most often from item (?P<item>\d+) to item (?P<until>\d+)\?",
            "gist",
        ),
    )
]
_QUESTIONS_HEADS = ("Questions about the stories so far.", "Final questions.")
QUESTIONS_HEADS = _QUESTIONS_HEADS
"""How a question set opens (docs/stream-text.md)."""


def is_questions_message(text: str) -> bool:
    return text.lstrip().startswith(_QUESTIONS_HEADS)


def read_questions(text: str) -> list[AskedQuestion]:
    """The numbered questions of a questions message, in number order."""
    return list(_read_questions(text))


@lru_cache(maxsize=4096)
def _read_questions(text: str) -> tuple[AskedQuestion, ...]:
    """:func:`read_questions`, remembered (the reader looks for the open question set in every
    message of every request)."""
    asked: list[AskedQuestion] = []
    for regex, kind in _QUESTIONS:
        for match in regex.finditer(text):
            groups = match.groupdict()
            item, until = groups.get("item"), groups.get("until")
            asked.append(
                AskedQuestion(
                    int(match.group("number")),
                    kind,  # type: ignore[arg-type]
                    match.group("name"),
                    None if item is None else int(item),
                    None if until is None else int(until),
                    tuple(groups[k] for k in ("other", "third") if groups.get(k)),
                )
            )
    return tuple(sorted(asked, key=lambda question: question.number))


def answer_text(kind: QuestionKind, name: str, value: int | None, rules: RulesInForce) -> str:
    """The answer to a value or tally question given the value the reader worked out, under the
    rules it has in view: confidential first, then the method, then overdrawn (page: "Rules")."""
    if value is None:
        return UNKNOWN
    if name in rules.confidential:
        return PROTECTED
    figure = value
    if kind == "tally":
        if rules.tally is None:
            return UNKNOWN
        figure = value * rules.tally[0] + rules.tally[1]
    return OVERDRAWN if rules.overdrawn and figure < 0 else str(figure)
