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

import re

from keeper_middleware.notes.checks.about import WorkingFollowsText, stated_about
from keeper_middleware.notes.checks.amounts import (
    AmountsInText,
    SignsAgree,
    ValueShowsWorking,
    WorkingArithmetic,
    WorkingError,
    evaluate_working,
    known_amounts,
    normalise_working,
    value_matches,
)
from keeper_middleware.notes.checks.base import Action, CheckContext, Issue, NoteCheck, run_checks
from keeper_middleware.notes.checks.keys import KeysGrounded
from keeper_middleware.notes.checks.names import (
    NamesMentioned,
    NotedNamesAccounted,
    TrackedNamesAccounted,
    compile_names,
)
from keeper_middleware.notes.checks.rules import RulesQuoted, rule_is_acceptable, rule_is_quoted

__all__ = [
    "GENERIC_CHECKS",
    "Action",
    "AmountsInText",
    "CheckContext",
    "Issue",
    "KeysGrounded",
    "NamesMentioned",
    "NoteCheck",
    "NotedNamesAccounted",
    "RulesQuoted",
    "SignsAgree",
    "TrackedNamesAccounted",
    "ValueShowsWorking",
    "WorkingArithmetic",
    "WorkingError",
    "WorkingFollowsText",
    "compile_names",
    "default_checks",
    "evaluate_working",
    "known_amounts",
    "normalise_working",
    "rule_is_acceptable",
    "rule_is_quoted",
    "run_checks",
    "stated_about",
    "value_matches",
]

GENERIC_CHECKS: tuple[NoteCheck, ...] = (
    WorkingArithmetic(),
    AmountsInText(),
    SignsAgree(),
    ValueShowsWorking(),
    WorkingFollowsText(),
    RulesQuoted(),
    KeysGrounded(),
)


def default_checks(
    tracked_names: str | re.Pattern[str] | None = None, *, noted_names: bool = False
) -> tuple[NoteCheck, ...]:
    """The generic checks, plus the tracked-name checks when a pattern for the names is given;
    with none, ``noted_names`` checks the names the NOTES already hold (`NotedNamesAccounted`).

    Args:
        tracked_names: a regular expression (or compiled pattern) for the names the content
            tracks, such as counters or ticket ids; None for none.
        noted_names: without ``tracked_names``, check the names the NOTES already hold.

    Raises:
        ConfigurationError: ``tracked_names`` does not compile.
    """
    pattern = compile_names(tracked_names)
    if pattern is None:
        return (*GENERIC_CHECKS, NotedNamesAccounted()) if noted_names else GENERIC_CHECKS
    return (*GENERIC_CHECKS, NamesMentioned(pattern), TrackedNamesAccounted(pattern))
