"""The stream's wording, written and read in one place (pinned in docs/stream-text.md).

The generator renders every sentence from the templates below, and the simulated reader reads the
same sentences back with regexes compiled from those very templates, so the two can never drift
apart. Everything here is pure: text in, events/rules/questions out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from keeper_middleware.numbers import to_words, words_to_int

EventKind = Literal["set", "add", "take", "add_held", "take_held"]
QuestionKind = Literal["current", "old", "who", "tally"]

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
}

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


def render_question(kind: QuestionKind, name: str, item: int | None = None) -> str:
    if kind in ("old", "who") and item is None:
        raise ValueError(f"a {kind!r} question needs the item it is about")
    return QUESTION_TEMPLATES[kind].format(name=name, n=item)


def render_questions_message(questions: Iterable[tuple[int, str]], *, final: bool = False) -> str:
    """The user message: header line, then one "N. question" line each."""
    header = FINAL_QUESTIONS_HEADER if final else QUESTIONS_HEADER
    return "\n".join([header, *(f"{number}. {text}" for number, text in questions)])


def render_batch_head(item: int) -> str:
    return f"Item {item}."


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------
_NUMBER_WORD = (
    "zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|"
    "fifteen|sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|eighty|"
    "ninety|hundred|thousand|million"
)
_AMOUNT = rf"(?:-?\d[\d,]*|(?i:(?:minus )?(?:{_NUMBER_WORD})(?:(?: and | |-)(?:{_NUMBER_WORD}))*))"
_ACTOR = r"[A-Z][a-z]+ [A-Z][a-z]+"
_NAME = r"[a-z]{3,7}\d{2}"
_PLACEHOLDER = re.compile(r"\{(Actor|name|other|amount|Amount)\}")
_GROUP = {
    "Actor": rf"(?P<actor>{_ACTOR})",
    "name": rf"(?P<name>\b{_NAME}\b)",
    "other": rf"(?P<other>\b{_NAME}\b)",
    "amount": rf"(?P<amount>{_AMOUNT})",
    "Amount": rf"(?P<amount>{_AMOUNT})",
}


def _template_regex(template: str) -> re.Pattern[str]:
    parts: list[str] = []
    position = 0
    for match in _PLACEHOLDER.finditer(template):
        parts.append(re.escape(template[position : match.start()]))
        parts.append(_GROUP[match.group(1)])
        position = match.end()
    parts.append(re.escape(template[position:]))
    return re.compile("".join(parts))


_PRONOUN_SET = frozenset(t for ts in PRONOUN_TEMPLATES.values() for t in ts)
_LEAD_RE = _template_regex(PRONOUN_LEAD)
# (regex, kind, style) where style says how to resolve the name: "named", "pronoun" or "held".
_READERS: list[tuple[re.Pattern[str], EventKind, str]] = [
    *((_template_regex(t), k, "named") for k, ts in PLAIN_TEMPLATES.items() for t in ts),
    *((_template_regex(t), k, "named") for k, ts in DECOY_TEMPLATES.items() for t in ts),
    *((_template_regex(t), k, "pronoun") for k, ts in PRONOUN_TEMPLATES.items() for t in ts),
    *((_template_regex(t), k, "held") for k, ts in HELD_TEMPLATES.items() for t in ts),
]


def _amount_value(text: str) -> int | None:
    cleaned = text.replace(",", "")
    if re.fullmatch(r"-?\d+", cleaned):
        return int(cleaned)
    return words_to_int(text)


def read_events(text: str) -> list[Event]:
    """Every change a text states, in the order it states them.

    "it" is the counter of the nearest preceding "Next on the list was X." sentence; an "it"
    with no such sentence before it (a passage cut mid-pair) cannot be resolved and is skipped.
    """
    found: list[tuple[int, str, re.Match[str], EventKind | None]] = []
    for match in _LEAD_RE.finditer(text):
        found.append((match.start(), "lead", match, None))
    for regex, event_kind, style in _READERS:
        for match in regex.finditer(text):
            found.append((match.start(), style, match, event_kind))
    found.sort(key=lambda entry: entry[0])
    events: list[Event] = []
    antecedent: str | None = None
    for _, style, match, kind in found:
        if style == "lead":
            antecedent = match.group("name")
            continue
        assert kind is not None
        groups = match.groupdict()
        actor = groups.get("actor") or CLERK
        if style == "held":
            events.append(Event(kind, groups["name"], None, groups["other"], actor))
            continue
        amount = _amount_value(groups["amount"])
        if amount is None:
            continue
        name = antecedent if style == "pronoun" else groups["name"]
        if name is None:
            continue
        events.append(Event(kind, name, amount, None, actor))
    return events


_ITEM_RE = re.compile(r"\A\s*Item (\d+)\.")


def read_item_number(text: str) -> int | None:
    match = _ITEM_RE.match(text)
    return int(match.group(1)) if match else None


_CONFIDENTIAL_RE = re.compile(
    rf"the counters ({_NAME}), ({_NAME}) and ({_NAME}) are confidential", re.IGNORECASE
)
_TALLY_RE = re.compile(
    rf"tally of a counter is its value times ({_AMOUNT}) plus ({_AMOUNT})"
    rf"|counter's tally is its value times ({_AMOUNT}) plus ({_AMOUNT})",
    re.IGNORECASE,
)
_OVERDRAWN_RE = re.compile(
    r"below zero, whether recorded or worked out, is reported as the single word overdrawn",
    re.IGNORECASE,
)


def read_rules(text: str) -> RulesInForce:
    """The rules a text states: a story's rule sentences, NOTES RULES lines or a [RULES] block.

    When a text states the method more than once, the last statement wins.
    """
    confidential: set[str] = set()
    for match in _CONFIDENTIAL_RE.finditer(text):
        confidential.update(name.lower() for name in match.groups())
    tally: tuple[int, int] | None = None
    for match in _TALLY_RE.finditer(text):
        raw = [g for g in match.groups() if g is not None]
        multiplier, addend = _amount_value(raw[0]), _amount_value(raw[1])
        if multiplier is not None and addend is not None:
            tally = (multiplier, addend)
    overdrawn = _OVERDRAWN_RE.search(text) is not None
    return RulesInForce(frozenset(confidential), tally, overdrawn)


def merge_rules(a: RulesInForce, b: RulesInForce) -> RulesInForce:
    """Rules from two texts; ``b``'s method wins when both state one."""
    return RulesInForce(
        a.confidential | b.confidential,
        b.tally if b.tally is not None else a.tally,
        a.overdrawn or b.overdrawn,
    )


_QUESTION_READERS: list[tuple[re.Pattern[str], QuestionKind]] = [
    (
        re.compile(
            r"^\s*(?P<number>\d+)\.\s+"
            + QUESTION_TEMPLATES[kind]
            .replace("?", r"\?")
            .replace("{name}", rf"(?P<name>{_NAME})")
            .replace("{n}", r"(?P<item>\d+)")
            + r"\s*$",
            re.MULTILINE,
        ),
        kind,
    )
    for kind in QUESTION_TEMPLATES
]


def read_questions(text: str) -> list[AskedQuestion]:
    """The numbered questions of a questions message, in number order."""
    asked: list[AskedQuestion] = []
    for regex, kind in _QUESTION_READERS:
        for match in regex.finditer(text):
            item = match.groupdict().get("item")
            asked.append(
                AskedQuestion(
                    int(match.group("number")),
                    kind,
                    match.group("name"),
                    None if item is None else int(item),
                )
            )
    return sorted(asked, key=lambda q: q.number)


def is_questions_message(text: str) -> bool:
    head = text.lstrip()
    return head.startswith(QUESTIONS_HEADER[:20]) or head.startswith(FINAL_QUESTIONS_HEADER[:16])


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

    The confidential rule wins over everything; a tally needs the method; below zero becomes
    "overdrawn" under that rule, for values and tallies alike. None means the history cannot say.
    """
    if kind == "who":
        return actor if actor is not None else UNKNOWN
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
