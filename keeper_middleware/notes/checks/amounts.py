"""Checks on amounts: the working adds up, uses only amounts the turns or NOTES hold, is shown
where a value needs it, and gives each amount the sign the text gives it."""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from keeper_middleware.errors import KeeperError
from keeper_middleware.notes.changes import Change, SetLine
from keeper_middleware.notes.checks.base import CheckContext, Issue
from keeper_middleware.notes.numbers import amounts_in, format_number, parse_number
from keeper_middleware.notes.signs import (
    amount_directions,
    signed_amounts_in,
    sum_terms,
    value_statements,
)

_IMPLIED_AMOUNTS = {
    r"\b(?:double[sd]?|twice|half|halved|halve[sd]?|pairs?)\b": 2.0,
    r"\b(?:triple[sd]?|thrice|thirds?)\b": 3.0,
    r"\b(?:quadruple[sd]?|quarters?)\b": 4.0,
    r"\b(?:per\s*cent|percent|%)": 100.0,
    r"\bdozens?\b": 12.0,
}
_THOUSANDS = re.compile(r"(?<![\d.])\d{1,3}(?:,\d{3})+(?![\d])")
_TIMES = re.compile(r"(?<=[\d)])\s*[x×X·]\s*(?=[\d(])")


class WorkingError(KeeperError, ValueError):
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
