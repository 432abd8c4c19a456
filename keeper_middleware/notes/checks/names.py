"""Checks on tracked names (story counters, file names, ticket ids): every name a change is
about is mentioned by the noted turns, and every name the turns change is accounted for."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from keeper_middleware.errors import ConfigurationError
from keeper_middleware.notes.changes import Change, RuleLine, SetLine, UnsetLine
from keeper_middleware.notes.checks.base import CheckContext, Issue
from keeper_middleware.notes.numbers import amounts_in


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
            if not sentence or sentence.endswith("?"):
                continue
            # the names first: only a sentence naming one the lines leave out is read for amounts
            # (most name only what the lines account for)
            unaccounted = [
                match.group()
                for match in pattern.finditer(sentence)
                if match.group().casefold() not in accounted
                and match.group().casefold() not in context.archived_keys
            ]
            if unaccounted and amounts_in(sentence):
                missing.update(dict.fromkeys(unaccounted))
        if not missing:
            return []
        names = ", ".join(missing)
        reason = (
            f"the turns state amounts for {names}, and no SET or UNSET line accounts for "
            f"{'it' if len(missing) == 1 else 'them'}"
        )
        return [Issue("", reason, self.name, "reask")]


_ONE_NAME = re.compile(r"\w[\w.-]*")


@dataclass(frozen=True, slots=True)
class NotedNamesAccounted:
    """`TrackedNamesAccounted` for the names the NOTES already track, with no pattern given.

    The names come from the conversation itself: every STATE key that is one word ("domo86",
    "invoice-17", "parser.py") is a name the model chose to keep. A sentence of the noted turns
    that names one and states an amount, with no line for it, is asked about again (a change
    overlooked); nothing is left out. A name the NOTES do not hold yet is not checked.
    """

    name: str = field(default="noted_names_accounted", init=False)

    def check(self, changes: Sequence[Change], context: CheckContext) -> list[Issue]:
        keys = sorted(
            {key for key, _ in context.notes.state if _ONE_NAME.fullmatch(key)},
            key=lambda key: (-len(key), key),
        )
        if not keys:
            return []
        alternatives = "|".join(re.escape(key) for key in keys)
        pattern = re.compile(rf"(?<!\w)(?:{alternatives})(?!\w)", re.IGNORECASE)
        return TrackedNamesAccounted(pattern).check(changes, context)


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
