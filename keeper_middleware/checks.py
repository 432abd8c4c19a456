"""Checks on note changes: the program redoes what it can verify before a line enters the notes.

Each check returns `Issue`s, and the issue's action says how sure the check is (measured: a check
that left out every line it could not follow kept stale values in the notes):

- ``drop``: left out at once, no question asked (a line about a name the noted turns never
  mention: it comes from text already noted; a new STATE key none of whose words the turns use;
  a RULE that is no instruction, rewords a rule, or would pass the cap on rules).
- ``drop_if_unresolved``: the text contradicts the line (the sum is wrong, the working uses an
  amount found nowhere, or an amount has the sign the text does not give it): asked again, and
  left out if the re-ask does not fix it.
- ``keep_if_unresolved``: questioned but not contradicted (a value with no working that the text
  does not state): asked again, and kept if the re-ask does not fix it.
- ``reask``: a problem with the reply as a whole (a tracked name the reply does not account for):
  asked again; nothing is left out.

Generic checks are always on; the tracked-name checks belong to a domain (story counters, file
names, ticket ids) and run only when a pattern for the names is given.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from keeper_middleware.changes import Change, RuleLine, SetLine, UnsetLine
from keeper_middleware.errors import ConfigurationError
from keeper_middleware.notes import Notes, normalise_entry
from keeper_middleware.numbers import amounts_in, format_number, parse_number
from keeper_middleware.rules import looks_like_instruction, quoted_in, rewording_of
from keeper_middleware.signs import (
    amount_directions,
    signed_amounts_in,
    sum_terms,
    value_statements,
)

Action = Literal["reask", "drop", "drop_if_unresolved", "keep_if_unresolved"]


@dataclass(frozen=True, slots=True)
class CheckContext:
    """What a check may compare a reply with."""

    noted_text: str
    """The text of the turns being noted (not the messages kept from before the notes)."""
    notes: Notes
    """The notes before this reply."""
    tracked_names: re.Pattern[str] | None = None
    """Names whose every change must be noted; None switches the tracked-name checks off."""
    instruction_text: str | None = None
    """What the user and the system prompt said (the pinned task included): the only text a
    RULE may quote. None: ``noted_text`` stands in (for callers that hold no other source)."""
    max_rules: int | None = None
    """The most rules the NOTES may hold; None: no cap."""
    archived_keys: frozenset[str] = frozenset()
    """STATE keys (case folded) whose entries left the NOTES for the archive: their last value is
    out of view, so a change to one cannot be worked out from the turns and the NOTES."""

    @property
    def rule_source(self) -> str:
        return self.noted_text if self.instruction_text is None else self.instruction_text


@dataclass(frozen=True, slots=True)
class Issue:
    """One problem found in a reply, in words the model can act on."""

    line: str
    """The canonical change line, or "" for a problem with the reply as a whole."""
    reason: str
    """What is wrong, as a clause: "the amount 650 is not in the turns or the notes"."""
    check: str
    """The name of the check that found it."""
    action: Action
    """What happens to the line (see the module docstring)."""


class NoteCheck(Protocol):
    """An extension point: one check over the change lines of a notes reply."""

    @property
    def name(self) -> str:
        """A short name for logs and counters."""
        ...

    def check(self, changes: Sequence[Change], context: CheckContext) -> list[Issue]: ...


_IMPLIED_AMOUNTS = {
    r"\b(?:double[sd]?|twice|half|halved|halve[sd]?|pairs?)\b": 2.0,
    r"\b(?:triple[sd]?|thrice|thirds?)\b": 3.0,
    r"\b(?:quadruple[sd]?|quarters?)\b": 4.0,
    r"\b(?:per\s*cent|percent|%)": 100.0,
    r"\bdozens?\b": 12.0,
}
_THOUSANDS = re.compile(r"(?<![\d.])\d{1,3}(?:,\d{3})+(?![\d])")
_TIMES = re.compile(r"(?<=[\d)])\s*[x×X·]\s*(?=[\d(])")


class WorkingError(ValueError):
    """A working that is not plain arithmetic over amounts."""


def normalise_working(working: str) -> str:
    """Working written the ways people write it, as Python arithmetic (1,204 × 2 − 3 → 1204*2-3)."""
    text = working.strip().replace("−", "-").replace("–", "-").replace("÷", "/")
    text = _THOUSANDS.sub(lambda m: m.group().replace(",", ""), text)
    return _TIMES.sub("*", text)


def _evaluate(node: ast.AST, amounts: list[float]) -> float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, amounts)
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        amounts.append(abs(float(node.value)))
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = _evaluate(node.operand, amounts)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult | ast.Div):
        left = _evaluate(node.left, amounts)
        right = _evaluate(node.right, amounts)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        if right == 0:
            raise WorkingError("it divides by zero")
        return left / right
    raise WorkingError("it is not arithmetic over amounts with + - * / and parentheses")


def evaluate_working(working: str) -> tuple[float, list[float]]:
    """The value of a working and the amounts it uses (absolute values), or `WorkingError`.

    A working that restates its result ("342 - 10 = 332") is read up to the first "=".
    """
    expression = normalise_working(working).split("=")[0].strip()
    if not expression:
        raise WorkingError("it is empty")
    try:
        tree = ast.parse(expression, mode="eval")
    except (SyntaxError, ValueError) as error:
        raise WorkingError(
            "it is not arithmetic over amounts with + - * / and parentheses"
        ) from error
    amounts: list[float] = []
    return _evaluate(tree, amounts), amounts


def _decimals(value_text: str) -> int:
    _, dot, fraction = value_text.strip().partition(".")
    return len(fraction) if dot and fraction.isdigit() else 0


def value_matches(value_text: str, result: float) -> bool:
    """Whether a written value equals a computed one; "33.33" matches 100/3 (rounded as shown)."""
    value = parse_number(value_text)
    if value is None:
        return False
    if math.isclose(value, result, rel_tol=1e-9, abs_tol=1e-9):
        return True
    places = _decimals(value_text)
    return places > 0 and math.isclose(round(result, places), value, abs_tol=1e-9)


def known_amounts(context: CheckContext) -> set[float]:
    """Amounts a working may use: those in the noted turns, the state values and the rules."""
    found = set(amounts_in(context.noted_text))
    for pattern, amount in _IMPLIED_AMOUNTS.items():
        if re.search(pattern, context.noted_text, re.IGNORECASE):
            found.add(amount)
    for _, value in context.notes.state:
        found |= amounts_in(value)
    for rule in context.notes.rules:
        found |= amounts_in(rule)
    return found


def _set_lines(changes: Sequence[Change]) -> list[SetLine]:
    return [change for change in changes if isinstance(change, SetLine)]


@dataclass(frozen=True, slots=True)
class WorkingArithmetic:
    """Redo every sum: a worked-out value must equal its working."""

    name: str = field(default="working_arithmetic", init=False)

    def check(self, changes: Sequence[Change], context: CheckContext) -> list[Issue]:
        issues: list[Issue] = []
        for line in _set_lines(changes):
            if line.working is None:
                continue
            try:
                result, _ = evaluate_working(line.working)
            except WorkingError as error:
                issues.append(
                    Issue(
                        line.render(),
                        f"the working could not be checked: {error}; write it with amounts "
                        "from the turns or the notes",
                        self.name,
                        "keep_if_unresolved",
                    )
                )
                continue
            if parse_number(line.value) is None:
                reason = f"the value {line.value!r} is not a number, but the working is a sum"
                issues.append(Issue(line.render(), reason, self.name, "keep_if_unresolved"))
            elif not value_matches(line.value, result):
                reason = f"the working comes to {format_number(result)}, not {line.value}"
                issues.append(Issue(line.render(), reason, self.name, "drop_if_unresolved"))
        return issues


@dataclass(frozen=True, slots=True)
class AmountsInText:
    """Every amount in a working must come from the turns or the notes (models invent working)."""

    name: str = field(default="amounts_in_text", init=False)

    def check(self, changes: Sequence[Change], context: CheckContext) -> list[Issue]:
        issues: list[Issue] = []
        known: set[float] | None = None
        for line in _set_lines(changes):
            if line.working is None:
                continue
            try:
                _, used = evaluate_working(line.working)
            except WorkingError:
                continue  # WorkingArithmetic reports it
            known = known_amounts(context) if known is None else known
            for amount in dict.fromkeys(used):
                if amount not in known:
                    reason = f"the amount {format_number(amount)} is not in the turns or the notes"
                    issues.append(Issue(line.render(), reason, self.name, "drop_if_unresolved"))
        return issues


@dataclass(frozen=True, slots=True)
class ValueShowsWorking:
    """A number the text does not state, with its sign, must show how it was worked out ("took
    six" states 6, not -6).

    Only questioned, never left out on this ground alone: the value may be right and written in
    a way no check can follow.
    """

    name: str = field(default="value_shows_working", init=False)

    def check(self, changes: Sequence[Change], context: CheckContext) -> list[Issue]:
        issues: list[Issue] = []
        held = context.notes.state_dict()
        stated: frozenset[float] | None = None
        for line in _set_lines(changes):
            value = parse_number(line.value)
            if line.working is not None or value is None or value == 0:
                continue
            stated = signed_amounts_in(context.noted_text) if stated is None else stated
            if value in stated or held.get(line.key) == line.value:
                continue
            reason = (
                f"the value {line.value} is not stated in the turns; if it was worked out, "
                "show the working"
            )
            issues.append(Issue(line.render(), reason, self.name, "keep_if_unresolved"))
        return issues


def _noted_values(context: CheckContext) -> set[float]:
    """Signed amounts the notes already hold (state values and rules)."""
    found: set[float] = set()
    for _, value in context.notes.state:
        found |= signed_amounts_in(value)
    for rule in context.notes.rules:
        found |= signed_amounts_in(rule)
    return found


@dataclass(frozen=True, slots=True)
class SignsAgree:
    """An amount's sign must agree with the text: a misread sign passes every other check.

    - A value, or the starting value of a working, that the turns state only with the other sign
      ("recorded domo86 at 342" noted as -342) is contradicted.
    - In a working, an amount that every sentence stating it takes ("ten were taken") must be
      taken, and one that every such sentence adds must be added.

    An amount the notes already hold, one stated in sentences of several directions, a product
    (a method's "value times five") and another counter's working in parentheses are not judged:
    the check leaves out only what the text contradicts.
    """

    name: str = field(default="signs_agree", init=False)

    def check(self, changes: Sequence[Change], context: CheckContext) -> list[Issue]:
        issues: list[Issue] = []
        values = value_statements(context.noted_text)
        directions = amount_directions(context.noted_text)
        held = _noted_values(context)
        known = values | held
        held_sizes = {abs(amount) for amount in held}

        def flipped(amount: float) -> bool:
            return amount != 0 and amount not in known and -amount in values

        for line in _set_lines(changes):
            if line.working is None:
                value = parse_number(line.value)
                if value is not None and flipped(value):
                    reason = (
                        f"the turns state {format_number(-value)}, not {line.value}: "
                        "the sign is wrong"
                    )
                    issues.append(Issue(line.render(), reason, self.name, "drop_if_unresolved"))
                continue
            terms = sum_terms(normalise_working(line.working).split("=")[0].strip())
            for position, term in enumerate(terms):
                if term is None:
                    continue
                if position == 0:
                    if flipped(term):
                        reason = (
                            f"the working starts from {format_number(term)}, but the turns "
                            f"state {format_number(-term)}: the sign is wrong"
                        )
                        issues.append(Issue(line.render(), reason, self.name, "drop_if_unresolved"))
                    continue
                amount = abs(term)
                if amount in held_sizes:
                    continue
                stated = directions.get(amount, frozenset())
                wrong = "take" if term > 0 else "add"
                if stated == {wrong}:
                    verb, used = ("take", "adds") if wrong == "take" else ("add", "takes")
                    reason = (
                        f"the turns {verb} {format_number(amount)}, but the working {used} it: "
                        "the sign is wrong"
                    )
                    issues.append(Issue(line.render(), reason, self.name, "drop_if_unresolved"))
        return issues


def _mentions(name: str, text: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text, re.IGNORECASE) is not None


@dataclass(frozen=True, slots=True)
class NamesMentioned:
    """A SET/UNSET about a tracked name the noted turns never mention is left out.

    Such a line comes from text that was already noted (a message kept in view after a cut).
    A name an OPEN entry of the notes names counts as mentioned: a change begun before the cut
    ("began a recount of domo86") may be finished by turns that do not repeat the name ("the
    recount came to 679"), and leaving that line out kept a stale value for a hundred batches.
    """

    tracked_names: re.Pattern[str] | None = None
    """The names to check; None uses the context's pattern."""
    name: str = field(default="names_mentioned", init=False)

    def check(self, changes: Sequence[Change], context: CheckContext) -> list[Issue]:
        pattern = self.tracked_names or context.tracked_names
        if pattern is None:
            return []
        issues: list[Issue] = []
        text = "\n".join([context.noted_text, *context.notes.open])
        seen = {match.group().casefold() for match in pattern.finditer(text)}

        def mentioned(name: str) -> bool:
            return name.casefold() in seen or _mentions(name, text)

        for change in changes:
            if not isinstance(change, SetLine | UnsetLine):
                continue
            names = [match.group() for match in pattern.finditer(change.key)]
            if names and not any(mentioned(name) for name in names):
                reason = f"{names[0]} is not mentioned in the turns being noted"
                issues.append(Issue(change.render(), reason, self.name, "drop"))
        return issues


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


@dataclass(frozen=True, slots=True)
class TrackedNamesAccounted:
    """Every tracked name the turns give an amount for must have a SET or UNSET line.

    A RULE line that names it also accounts for it; questions (sentences ending in "?") state
    nothing and are skipped; so are names whose entries left the NOTES for the archive (their
    value is out of view: asking again cannot make the model work out a change to it).
    """

    tracked_names: re.Pattern[str] | None = None
    """The names to check; None uses the context's pattern."""
    name: str = field(default="tracked_names_accounted", init=False)

    def check(self, changes: Sequence[Change], context: CheckContext) -> list[Issue]:
        pattern = self.tracked_names or context.tracked_names
        if pattern is None:
            return []
        accounted: set[str] = set()
        for change in changes:
            if isinstance(change, SetLine | UnsetLine):
                accounted |= {m.group().casefold() for m in pattern.finditer(change.key)}
            elif isinstance(change, RuleLine):
                accounted |= {m.group().casefold() for m in pattern.finditer(change.text)}
        missing: dict[str, None] = {}
        for sentence in _SENTENCE_END.split(context.noted_text):
            sentence = sentence.strip()
            if not sentence or sentence.endswith("?") or not amounts_in(sentence):
                continue
            for match in pattern.finditer(sentence):
                folded = match.group().casefold()
                if folded not in accounted and folded not in context.archived_keys:
                    missing[match.group()] = None
        if not missing:
            return []
        names = ", ".join(missing)
        reason = (
            f"the turns state amounts for {names}, and no SET or UNSET line accounts for "
            f"{'it' if len(missing) == 1 else 'them'}"
        )
        return [Issue("", reason, self.name, "reask")]


def rule_is_quoted(rule: RuleLine, context: CheckContext) -> bool:
    """A rule line copies a rule the user or the system prompt stated (or one the notes hold)."""
    wanted = normalise_entry(rule.text).strip("\"'“”‘’ ")
    if not wanted:
        return False
    if any(normalise_entry(known) == wanted for known in context.notes.rules):
        return True
    return quoted_in(rule.text, context.rule_source)


def rule_is_acceptable(rule: RuleLine, context: CheckContext) -> bool:
    """A rule line may enter the RULES: already there, or a new quoted instruction that rewords
    no rule the notes hold."""
    wanted = normalise_entry(rule.text)
    if any(normalise_entry(known) == wanted for known in context.notes.rules):
        return True
    return (
        looks_like_instruction(rule.text)
        and rule_is_quoted(rule, context)
        and rewording_of(rule.text, context.notes.rules) is None
    )


@dataclass(frozen=True, slots=True)
class RulesQuoted:
    """A RULE line must be an instruction the user or the system prompt gave, word for word.

    Rules are repeated next to every question and can never be removed, so a "rule" that only
    restates the task, a fact copied from a story, a model's own words or a tool's output, or a
    template line copied from the request, would be followed for ever. A line that is no
    instruction, or rewords a rule the notes hold, is left out at once (asking again cannot make
    it one); a line not found word for word is asked for again; rules past the cap are left out.
    """

    name: str = field(default="rules_quoted", init=False)

    def check(self, changes: Sequence[Change], context: CheckContext) -> list[Issue]:
        issues: list[Issue] = []
        known = {normalise_entry(rule) for rule in context.notes.rules}
        accepted: list[str] = []
        for change in changes:
            if not isinstance(change, RuleLine):
                continue
            key = normalise_entry(change.text)
            if key in known:
                continue
            reason, action = self._problem(change, context, accepted)
            if reason is None:
                known.add(key)
                accepted.append(change.text)
                continue
            issues.append(Issue(change.render(), reason, self.name, action))
        return issues

    @staticmethod
    def _problem(
        change: RuleLine, context: CheckContext, accepted: Sequence[str]
    ) -> tuple[str | None, Action]:
        if not looks_like_instruction(change.text):
            return "this is not an instruction the user gave; keep facts in STATE", "drop"
        original = rewording_of(change.text, (*context.notes.rules, *accepted))
        if original is not None:
            return f"this restates the rule {original!r}, which the notes already hold", "drop"
        if not rule_is_quoted(change, context):
            return (
                "this rule is not in what the user or the system prompt said, word for word; "
                "copy the rule exactly as they stated it",
                "drop_if_unresolved",
            )
        cap = context.max_rules
        if cap is not None and len(context.notes.rules) + len(accepted) >= cap:
            return f"the RULES are full ({cap} rules); keep this in STATE or OPEN", "drop"
        return None, "drop"


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


GENERIC_CHECKS: tuple[NoteCheck, ...] = (
    WorkingArithmetic(),
    AmountsInText(),
    SignsAgree(),
    ValueShowsWorking(),
    RulesQuoted(),
    KeysGrounded(),
)


def compile_names(tracked_names: str | re.Pattern[str] | None) -> re.Pattern[str] | None:
    """A tracked-names pattern from a regular expression string, with a clear error if it is bad."""
    if tracked_names is None or isinstance(tracked_names, re.Pattern):
        return tracked_names
    try:
        return re.compile(tracked_names)
    except re.error as error:
        raise ConfigurationError(
            f"tracked_names {tracked_names!r} is not a valid regular expression ({error}); "
            r"give a pattern that matches one name, e.g. r'\b[a-z]+\d{2}\b'."
        ) from error


def default_checks(tracked_names: str | re.Pattern[str] | None = None) -> tuple[NoteCheck, ...]:
    """The generic checks, plus the tracked-name checks when a pattern for the names is given."""
    pattern = compile_names(tracked_names)
    if pattern is None:
        return GENERIC_CHECKS
    return (*GENERIC_CHECKS, NamesMentioned(pattern), TrackedNamesAccounted(pattern))


def run_checks(
    changes: Sequence[Change], context: CheckContext, checks: Sequence[NoteCheck]
) -> list[Issue]:
    """Every issue every check finds, in check order."""
    return [issue for check in checks for issue in check.check(changes, context)]
