"""What every note check shares: what it may compare a reply with, what it reports, and
the protocol a check implements (the extension point)."""

from __future__ import annotations

import re
from collections.abc import Container, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from keeper_middleware.notes.block import Notes
from keeper_middleware.notes.changes import Change

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
    archived_keys: Container[str] = frozenset()
    """STATE keys (case folded) whose entries left the NOTES for the archive: their last value is
    out of view, so a change to one cannot be worked out from the turns and the NOTES. Ask it
    with ``in`` (the keeper passes a lookup into the archive, not the whole list)."""

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


def run_checks(
    changes: Sequence[Change], context: CheckContext, checks: Sequence[NoteCheck]
) -> list[Issue]:
    """Every issue every check finds, in check order."""
    return [issue for check in checks for issue in check.check(changes, context)]
