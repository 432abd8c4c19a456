"""Checks on RULE lines: an instruction quoted from the user or the system prompt, never a
rewording of a rule already held, and within the cap on rules."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from keeper_middleware.notes.block import normalise_entry
from keeper_middleware.notes.changes import Change, RuleLine
from keeper_middleware.notes.checks.base import Action, CheckContext, Issue
from keeper_middleware.notes.rules import looks_like_instruction, quoted_in, rewording_of


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
