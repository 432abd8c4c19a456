"""The stream's wording as the generator writes it (described in docs/stream-text.md).

The generator renders every sentence from the templates below. Nothing here reads text back: the
simulated reader has its own parser, written from docs/stream-text.md, and the tests derive the
ledger from the text with a third one, so a template the page does not describe, or describes
wrongly, costs the reader answers instead of passing unseen. Everything here is pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from keeper_middleware.notes.numbers import to_words

EventKind = Literal["set", "add", "take", "add_held", "take_held"]
QuestionKind = Literal["current", "old", "who", "tally", "before_last", "count", "order", "gist"]

NAME_RE = re.compile(r"\b[a-z]{3,7}\d{2}\b")
CLERK = "the clerk"

# ---------------------------------------------------------------------------------------------
# Templates (data). {Actor} "Firstname Lastname"; {name}/{other} counter names; {amount} digits
# or words; {Amount} the same at the start of a sentence (capitalised when in words).
# ---------------------------------------------------------------------------------------------
CLERK_TEMPLATE = "The clerk recorded {name} at {amount}."
PLAIN_TEMPLATES: dict[EventKind, tuple[str, ...]] = {
    "set": (
        "{Actor} recorded {name} at {amount}.",
        CLERK_TEMPLATE,
        "{name} was set to {amount} by {Actor}.",
    ),
    "add": ("{Actor} added {amount} to {name}.", "{Amount} were added to {name} by {Actor}."),
    "take": ("{Actor} took {amount} from {name}.", "{Amount} were taken from {name} by {Actor}."),
}
PRONOUN_LEAD = "Next on the list was {name}."
PRONOUN_TEMPLATES: dict[EventKind, tuple[str, ...]] = {
    "set": ("{Actor} recorded it at {amount}.",),
    "add": ("{Actor} added {amount} to it.",),
    "take": ("{Actor} took {amount} from it.",),
}
HELD_TEMPLATES: dict[EventKind, tuple[str, ...]] = {
    "add_held": ("{Actor} added to {name} as much as {other} held.",),
    "take_held": ("{Actor} took from {name} as much as {other} held.",),
}
DECOY_TEMPLATES: dict[EventKind, tuple[str, ...]] = {
    "take": ("{name} lost {amount} when {Actor} dropped a crate.",),
    "add": ("{name} regained {amount} thanks to {Actor}.",),
}

# The varied family: more phrasings of the same events (paraphrases, passive voice, pronoun chains,
# corrections and changes split over two items), so the text is not the reader's own.
VARIED_TEMPLATES: dict[EventKind, tuple[str, ...]] = {
    "set": (
        "{Actor} logged {name} at {amount}.",
        "{name} was recorded at {amount} by {Actor}.",
        "{Actor} brought {name} to {amount}.",
    ),
    "add": (
        "{Actor} put {amount} more into {name}.",
        "{name} was credited with {amount} by {Actor}.",
        "{Actor} raised {name} by {amount}.",
    ),
    "take": (
        "{Actor} removed {amount} from {name}.",
        "{name} was debited {amount} by {Actor}.",
        "{Actor} lowered {name} by {amount}.",
    ),
}
CHAIN_LEADS = ("Next on the list was {name}.", "Attention turned to {name}.", "Then came {name}.")
CHAIN_TEMPLATES: dict[EventKind, tuple[str, ...]] = {
    "set": ("{Actor} recorded it at {amount}.", "It was set to {amount} by {Actor}."),
    "add": ("{Actor} added {amount} to it.", "{Actor} put {amount} more into it."),
    "take": ("{Actor} took {amount} from it.", "{Actor} removed {amount} from it."),
}
CORRECTION_TEMPLATE = "Correction: that should have read {amount}."
SPLIT_START_TEMPLATE = "{Actor} began a recount of {name}."
SPLIT_END_TEMPLATE = "The recount begun in the previous item came to {amount}."

CONFIDENTIAL_RULE = (
    "Standing rule: the counters {a}, {b} and {c} are confidential; whenever asked for the value "
    "of one of them, answer with the single word protected."
)
TALLY_METHOD = "House method: the tally of a counter is its value times {multiplier} plus {addend}."
OVERDRAWN_RULE = (
    "Standing rule: any figure below zero, whether recorded or worked out, is reported as the "
    "single word overdrawn."
)

QUESTIONS_HEADER = (
    'Questions about the stories so far. Answer each on its own line as "N. answer"; '
    "answer unknown if the stories never say."
)
FINAL_QUESTIONS_HEADER = (
    'Final questions. Answer each on its own line as "N. answer"; '
    "answer unknown if the stories never say."
)
QUESTION_TEMPLATES: dict[QuestionKind, str] = {
    "current": "What value does {name} hold now?",
    "old": "What value did {name} hold at the end of item {n}?",
    "who": "Who changed {name} in item {n}?",
    "tally": "What is the tally of {name} now?",
    "before_last": "What value did {name} hold before its last change?",
    "count": "How many times did {name} change from item {n} to item {m}?",
    "order": "Which was recorded first, {name} or {other}?",
    "gist": "Which of {name}, {other} and {third} changed most often from item {n} to item {m}?",
}
NAMED_ANSWERS: frozenset[QuestionKind] = frozenset({"order", "gist"})
"""Question kinds answered with a counter's name (no value: the rules do not apply)."""

PROTECTED = "protected"
OVERDRAWN = "overdrawn"
UNKNOWN = "unknown"


# ---------------------------------------------------------------------------------------------
# Data read from text
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Event:
    """One change to one counter, as a sentence states it."""

    kind: EventKind
    name: str
    amount: int | None
    """The stated amount; None for the *_held kinds, whose amount is ``source``'s value."""
    source: str | None
    """The other counter whose value a *_held change uses."""
    actor: str
    """"Firstname Lastname", or "the clerk" for the clerk form."""


@dataclass(frozen=True, slots=True)
class RulesInForce:
    confidential: frozenset[str] = frozenset()
    tally: tuple[int, int] | None = None
    """(multiplier, addend) of the house method, e.g. (5, 13)."""
    overdrawn: bool = False


@dataclass(frozen=True, slots=True)
class AskedQuestion:
    number: int
    kind: QuestionKind
    name: str
    item: int | None


# ---------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------
def render_amount(amount: int, *, words: bool, sentence_start: bool = False) -> str:
    text = to_words(amount) if words else str(amount)
    return text[:1].upper() + text[1:] if sentence_start else text


def fill(
    template: str,
    *,
    name: str = "",
    actor: str = "",
    amount: int | None = None,
    words: bool = False,
    other: str = "",
    n: int | None = None,
) -> str:
    """Fill one template; only the placeholders the template uses need values."""
    values = {
        "name": name,
        "Actor": actor,
        "other": other,
        "amount": "" if amount is None else render_amount(amount, words=words),
        "Amount": "" if amount is None else render_amount(amount, words=words, sentence_start=True),
        "n": "" if n is None else str(n),
    }
    return template.format(**values)


def render_change(event: Event, template: str, *, words: bool) -> str:
    """Render ``event`` with ``template`` (one of the template strings above).

    A template from PRONOUN_TEMPLATES is preceded by its lead sentence naming the counter, so the
    result is the pinned two-sentence pair.
    """
    text = fill(
        template,
        name=event.name,
        actor=event.actor,
        amount=event.amount,
        words=words,
        other=event.source or "",
    )
    if template in _PRONOUN_SET:
        return fill(PRONOUN_LEAD, name=event.name) + " " + text
    return text


def render_rules(
    *,
    confidential: Sequence[str] = (),
    tally: tuple[int, int] | None = None,
    overdrawn: bool = False,
) -> list[str]:
    """The rule/method sentences a rules-carrying first batch states, in a fixed order."""
    lines: list[str] = []
    if confidential:
        if len(confidential) != 3:
            raise ValueError(
                f"the confidential rule names exactly three counters, got {confidential!r}"
            )
        a, b, c = confidential
        lines.append(CONFIDENTIAL_RULE.format(a=a, b=b, c=c))
    if tally is not None:
        lines.append(TALLY_METHOD.format(multiplier=to_words(tally[0]), addend=to_words(tally[1])))
    if overdrawn:
        lines.append(OVERDRAWN_RULE)
    return lines


def render_question(
    kind: QuestionKind,
    name: str,
    item: int | None = None,
    *,
    until: int | None = None,
    others: Sequence[str] = (),
) -> str:
    """One question's text; ``item``/``until`` the items it is about, ``others`` the other names
    an order or gist question compares ``name`` with."""
    if kind in ("old", "who", "count", "gist") and item is None:
        raise ValueError(f"a {kind!r} question needs the item it is about")
    if kind in ("count", "gist") and until is None:
        raise ValueError(f"a {kind!r} question needs the last item of its span (until)")
    wanted = {"order": 1, "gist": 2}.get(kind, 0)
    if len(others) != wanted:
        raise ValueError(f"a {kind!r} question compares {wanted} other name(s), got {others!r}")
    other, third = (*others, "", "")[:2]
    return QUESTION_TEMPLATES[kind].format(name=name, n=item, m=until, other=other, third=third)


def render_questions_message(questions: Iterable[tuple[int, str]], *, final: bool = False) -> str:
    """The user message: header line, then one "N. question" line each."""
    header = FINAL_QUESTIONS_HEADER if final else QUESTIONS_HEADER
    return "\n".join([header, *(f"{number}. {text}" for number, text in questions)])


BATCH_HEAD_WORDS = ("Item", "Entry")
"""The words a batch head can start with: "Item N." (the default), or "Entry N." (the
``entry_heads`` family), which the product's default ``item_pattern`` (Item, Batch, Ticket) does
not match, so a keeper meets a stream whose item numbers it is not given."""
BATCH_HEAD_WORD = "(?:" + "|".join(BATCH_HEAD_WORDS) + ")"
"""The head words as a regular-expression group, for whoever reads the heads back."""


def render_batch_head(item: int, *, word: str = "Item") -> str:
    """A batch's head line: "Item N." or, in the ``entry_heads`` family, "Entry N."."""
    if word not in BATCH_HEAD_WORDS:
        raise ValueError(f"a batch head starts with one of {BATCH_HEAD_WORDS}, got {word!r}")
    return f"{word} {item}."


_PRONOUN_SET = frozenset(t for ts in PRONOUN_TEMPLATES.values() for t in ts)


# ---------------------------------------------------------------------------------------------
# Answering under the rules (the grader's truth and the reader's behaviour share it)
# ---------------------------------------------------------------------------------------------
def answer_under_rules(
    kind: QuestionKind,
    name: str,
    value: int | None,
    rules: RulesInForce,
    *,
    actor: str | None = None,
) -> str:
    """The right answer to a question, given the true value (or actor) and the rules in force.

    A "who" question is answered with ``actor``, an order or gist question with the counter's
    name (passed as ``actor``), a count with ``value`` as it is (a count is no value a rule
    covers). Otherwise the confidential rule wins over everything; a tally needs the method; below zero becomes
    "overdrawn" under that rule, for values and tallies alike. None means the history cannot say.
    """
    if kind == "who" or kind in NAMED_ANSWERS:
        return actor if actor is not None else UNKNOWN
    if kind == "count":
        return UNKNOWN if value is None else str(value)
    if value is None:
        return UNKNOWN
    if name in rules.confidential:
        return PROTECTED
    figure = value
    if kind == "tally":
        if rules.tally is None:
            return UNKNOWN
        figure = value * rules.tally[0] + rules.tally[1]
    if rules.overdrawn and figure < 0:
        return OVERDRAWN
    return str(figure)


def apply_change(current: int | None, event: Event, source_value: int | None = None) -> int | None:
    """The counter's value after ``event``; None when the change cannot be worked out.

    A set needs nothing; an add/take needs the current value; a *_held change also needs the
    value the other counter holds at that moment.
    """
    if event.kind == "set":
        return event.amount
    if current is None:
        return None
    if event.kind in ("add_held", "take_held"):
        if source_value is None:
            return None
        return current + source_value if event.kind == "add_held" else current - source_value
    assert event.amount is not None
    return current + event.amount if event.kind == "add" else current - event.amount
