"""What one keeper step hands back to its adapter, and what it carries between its phases.

A step decides (pure, under the session's lock), may call the model for notes (the only part
that differs between sync and async), then finishes (archive and NOTES in one transaction).
The decision is carried between those phases as a :class:`Pending`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import BaseMessage

from keeper_middleware.notes.block import Notes
from keeper_middleware.notes.recall import NO_ARCHIVED_KEYS, ArchivedKeys
from keeper_middleware.step.backlog import Backlog
from keeper_middleware.step.cut import CutPlan
from keeper_middleware.step.entries import Entry
from keeper_middleware.step.known import KnownEntries
from keeper_middleware.step.tail import Appending, WindowFacts


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one keeper step decided: the new message list and the keeper's bookkeeping."""

    messages: list[BaseMessage]
    """The messages to send on: a new list, the step's input is never changed."""
    state: dict[str, Any]
    """The keeper's bookkeeping, to be stored with the graph state."""
    changed: bool
    """True when ``messages`` differs from what the step was given."""
    rewritten: bool
    """True when messages were removed or replaced (not only appended)."""
    cut: bool = False
    """True when the step archived turns and wrote a NOTES version for them."""


@dataclass(slots=True)
class Pending:
    """A step between its decision and its model calls."""

    session: str
    messages: list[BaseMessage]
    state: dict[str, Any]
    plan: CutPlan | None
    notes: Notes
    request: list[BaseMessage] = field(default_factory=list)
    key: str = ""
    tool_schemas: list[dict[str, Any]] = field(default_factory=list)
    replaced: bool = False
    """A message was replaced under its own id (an excerpt, a forged tag removed)."""
    archived_keys: ArchivedKeys = NO_ARCHIVED_KEYS
    """Whether a case-folded name is a STATE key whose entry is in the archive, not the NOTES
    (read from the archive as the names come up)."""
    moved_entries: Mapping[str, str] = field(default_factory=dict)
    """The moved entries the noted turns may name, each as last noted (what a notes request
    may recall; ``recall.named_in`` picks those the turns name)."""
    recalled: tuple[tuple[str, str], ...] = ()
    """The moved entries the notes request recalls (the noted turns name them)."""
    entries: list[Entry] = field(default_factory=list)
    """``messages`` as classified where they entered the step (one entry per message)."""
    backlog: Backlog | None = None
    """What the step took in beyond this window, noted in later parts (a cut each)."""
    facts: WindowFacts | None = None
    """What the whole-window passes give for ``entries``, when the step only appended to the
    window its session's last step ended with (:mod:`~keeper_middleware.step.tail`)."""
    appending: Appending | None = None
    """That last window's facts as this step extended them."""
    before: KnownEntries | None = None
    """That last window's entries, taken out for this step."""
