"""Grade a marathon: which tickets were fixed, which were clean, what regressed, the audit answer.

Pure functions over what the harness recorded: the files before and after each ticket, the final
test outcome and the replies. A ticket is *fixed* when none of its defect's tests fail at the end;
it is *clean* when every instruction in force while it was worked was kept for it:

- ``# fixed``: every library line the ticket changed ends with that comment;
- ``FIXES.md``: a new line starting with the function's name;
- ``RECIPES.txt``: for a fix in ``recipes.py``, a new line naming the function.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from keeper_bench.marathon.planting import LIBRARY_FILES
from keeper_bench.marathon.tickets import (
    Ticket,
    fixes_before_log,
    parse_audit_answer,
)

Files = Mapping[str, str]
"""Path (relative to the project) → text; a missing file is absent."""

FIXES_FILE = "FIXES.md"
RECIPES_FILE = "RECIPES.txt"


@dataclass(frozen=True, slots=True)
class TicketGrade:
    number: int
    function: str
    fixed: bool
    clean: bool
    broken: tuple[str, ...] = ()
    """The instructions in force that this ticket broke (by notice key)."""


@dataclass(frozen=True, slots=True)
class MarathonGrade:
    tickets: tuple[TicketGrade, ...]
    regressions: tuple[str, ...]
    """Tests failing at the end that passed before the marathon (with the defects planted)."""
    audit_expected: tuple[str, ...]
    audit_answer: str | None
    audit_right: bool | None
    notices_kept: dict[str, bool] = field(default_factory=dict)
    """Per notice with a NOTES version after it: its instruction was in the RULES of every such
    version (keeper ways)."""

    @property
    def fixed(self) -> int:
        return sum(t.fixed for t in self.tickets)

    @property
    def clean(self) -> int:
        return sum(t.fixed and t.clean for t in self.tickets)


def changed_lines(before: str, after: str) -> list[str]:
    """The lines of ``after`` that are new or changed relative to ``before``."""
    matcher = difflib.SequenceMatcher(a=before.splitlines(), b=after.splitlines(), autojunk=False)
    changed: list[str] = []
    for tag, _i1, _i2, j1, j2 in matcher.get_opcodes():
        if tag in ("replace", "insert"):
            changed.extend(after.splitlines()[j1:j2])
    return changed


def _new_lines(before: Files, after: Files, name: str) -> list[str]:
    return changed_lines(before.get(name, ""), after.get(name, ""))


def broken_instructions(
    ticket: Ticket, in_force: Sequence[str], before: Files, after: Files
) -> list[str]:
    """The standing instructions (notice keys) that the work on ``ticket`` did not keep."""
    assert ticket.defect is not None
    function = ticket.defect.defect.function
    broken: list[str] = []
    if "fixed_comment" in in_force:
        lines = [line for name in LIBRARY_FILES for line in _new_lines(before, after, name)]
        if any(line.strip() and not line.rstrip().endswith("# fixed") for line in lines):
            broken.append("fixed_comment")
    if "fixes_log" in in_force:
        pattern = re.compile(rf"^\W*{re.escape(function)}\b")
        if not any(pattern.match(line) for line in _new_lines(before, after, FIXES_FILE)):
            broken.append("fixes_log")
    if "recipes_log" in in_force and ticket.defect.defect.path.endswith("recipes.py"):
        pattern = re.compile(rf"\b{re.escape(function)}\b")
        if not any(pattern.search(line) for line in _new_lines(before, after, RECIPES_FILE)):
            broken.append("recipes_log")
    return broken


def grade_marathon(
    tickets: Sequence[Ticket],
    snapshots: Sequence[tuple[Files, Files]],
    final_failed: frozenset[str],
    start_failed: frozenset[str],
    replies: Sequence[str],
    notes_rules: Sequence[tuple[int, Sequence[str]]] = (),
) -> MarathonGrade:
    """``snapshots[i]`` is (files before, files after) ticket ``i``; ``replies[i]`` its last reply.

    ``notes_rules`` is, for the keeper ways, every saved NOTES version as (the ticket it was saved
    during, its RULES lines).
    """
    grades: list[TicketGrade] = []
    in_force: list[str] = []
    given_at: dict[str, int] = {}
    audit_answer: str | None = None
    for index, ticket in enumerate(tickets):
        if ticket.notice is not None:
            in_force.append(ticket.notice.key)
            given_at[ticket.notice.key] = ticket.number
        elif ticket.defect is not None:
            before, after = snapshots[index]
            broken = broken_instructions(ticket, in_force, before, after)
            fixed = not (set(ticket.defect.failing) & final_failed)
            grades.append(
                TicketGrade(
                    ticket.number, ticket.defect.defect.function, fixed, not broken, tuple(broken)
                )
            )
        elif ticket.kind == "audit":
            audit_answer = replies[index] if index < len(replies) else None
    expected = fixes_before_log(list(tickets))
    audit_right: bool | None = None
    if any(t.kind == "audit" for t in tickets):
        count, names = parse_audit_answer(audit_answer or "")
        audit_right = count == len(expected) and names == frozenset(expected)
    kept: dict[str, bool] = {}
    if notes_rules:
        for ticket in tickets:
            if ticket.notice is None:
                continue
            later = [rules for at, rules in notes_rules if at >= given_at[ticket.notice.key]]
            instruction = ticket.notice.instruction
            if later:  # a notice after the last NOTES version has nothing to be kept in yet
                kept[ticket.notice.key] = all(
                    any(instruction in rule for rule in rules) for rules in later
                )
    return MarathonGrade(
        tickets=tuple(grades),
        regressions=tuple(sorted(final_failed - start_failed)),
        audit_expected=tuple(expected),
        audit_answer=audit_answer,
        audit_right=audit_right,
        notices_kept=kept,
    )
