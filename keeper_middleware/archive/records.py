"""What the archive holds: turns word for word, NOTES versions, cut records, moved entries.

Turns are numbered twice: ``seq`` is the order within the session (gap-free, assigned by the
store), and ``item`` is the content's own numbering (the batch, ticket or input a turn belongs
to), the only numbering the model ever sees. Every NOTES version is kept with the item range it
covers, so an audit can compare each one with the truth at that point.

A turn is an immutable record named by its message id and a digest of what it holds
(:func:`turn_digest`): a message edited under its id, or sent again with new text, is a new
record beside the old one, never a rewrite. Cuts form a chain, each naming its parent, so a
conversation that forks (LangGraph time travel, replays, edits) is a tree of cuts over one set of
records; a :class:`Chain` says which cuts and records one branch sees (docs/branches.md).

The records check themselves when made, so a store (SQLite, PostgreSQL or a user's own) never
receives a turn without an id or a notes range running backwards.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from keeper_middleware.errors import ArgumentTypeError, ConfigurationError
from keeper_middleware.messages.facts import reasoning_of, text_of

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

    from keeper_middleware.retrievers.base import Spans

__all__ = [
    "ROLES",
    "TIP",
    "ArchivedTurn",
    "Chain",
    "CutRecord",
    "MovedUpdate",
    "NotesDraft",
    "NotesVersion",
    "Tip",
    "turn_digest",
    "turn_from_message",
]

ROLES = ("system", "human", "ai", "tool")


class Tip(enum.Enum):
    """The session's latest cut, whichever branch made it: what a caller that knows no branch
    means (a linear conversation, the proxy, an audit)."""

    TIP = "tip"


TIP = Tip.TIP
"""The session's latest cut (see :class:`Tip`)."""

Head = str | None | Tip
"""A branch's latest cut: its key, None before any cut (the root), or :data:`TIP`."""

_FIELD = b"\x1f"


def turn_digest(
    *,
    item: int | None,
    role: str,
    content: str,
    tool_calls_json: str,
    tool_call_id: str | None,
    name: str | None,
    reasoning: str,
) -> str:
    """The name of what a turn holds (32 hex digits of a SHA-256): two turns with one message id
    are one record only when this matches. PostgreSQL computes the same digest of the rows it
    migrates (``postgres.schema``), so the bytes hashed are fixed: each field as UTF-8
    (lone surrogates kept), an optional one as "-" when absent and "+" then its value, fields
    separated by the unit separator."""

    def optional(value: object) -> bytes:
        return b"-" if value is None else b"+" + str(value).encode("utf-8", "surrogatepass")

    parts = (
        optional(item),
        role.encode("utf-8", "surrogatepass"),
        content.encode("utf-8", "surrogatepass"),
        tool_calls_json.encode("utf-8", "surrogatepass"),
        optional(tool_call_id),
        optional(name),
        reasoning.encode("utf-8", "surrogatepass"),
    )
    return hashlib.sha256(_FIELD.join(parts)).hexdigest()[:32]


def _require_session(session: str) -> None:
    if not isinstance(session, str) or not session:
        raise ConfigurationError(f"session must be a non-empty string, got {session!r}")


def _require_json(text: str, field: str, kind: type) -> None:
    try:
        value = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"{field} must be a JSON string, got {text!r:.80}: {exc}") from exc
    if not isinstance(value, kind):
        raise ConfigurationError(f"{field} must encode a JSON {kind.__name__}, got {text!r:.80}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ArchivedTurn:
    """One message as it was in the conversation, kept word for word."""

    session: str
    """The conversation (thread) it belongs to."""
    msg_id: str
    """The message id. Not unique on its own: a message edited under its id, or sent again with
    new text, is a second record by design. What is unique is the id with the :attr:`digest` on
    a branch: archiving the same turn twice on one branch (a cut moving out an excerpt whose
    whole text was archived as it arrived) keeps one record."""
    item: int | None
    """The content's own number for the input this turn belongs to; None before the first item."""
    role: str
    """One of "system", "human", "ai", "tool"."""
    content: str
    """The text, word for word; multi-part content is passed as its text."""
    tool_calls_json: str = "[]"
    """The tool calls the turn made, as a JSON list (a string, so the turn stays hashable)."""
    tool_call_id: str | None = None
    """For a tool result, the call it answers."""
    name: str | None = None
    """The message's name (a tool's name for a tool result), if any."""
    reasoning: str = ""
    """Reasoning text, kept apart from the content: it is archived but never put back in view."""
    seq: int = -1
    """Order within the session (0-based, gap-free), assigned by the store; ignored on commit."""
    digest: str = ""
    """What the turn holds, named (:func:`turn_digest`); worked out when not given."""

    def __post_init__(self) -> None:
        _require_session(self.session)
        if not isinstance(self.msg_id, str) or not self.msg_id:
            raise ConfigurationError(
                f"msg_id must be a non-empty string, got {self.msg_id!r}: give every message "
                "an id before archiving it"
            )
        if self.role not in ROLES:
            raise ConfigurationError(f"role must be one of {ROLES}, got {self.role!r}")
        if not isinstance(self.content, str):
            raise ArgumentTypeError(
                f"content must be str, got {type(self.content).__name__}: pass the text"
            )
        _require_json(self.tool_calls_json, "tool_calls_json", list)
        if not self.digest:
            object.__setattr__(
                self,
                "digest",
                turn_digest(
                    item=self.item,
                    role=self.role,
                    content=self.content,
                    tool_calls_json=self.tool_calls_json,
                    tool_call_id=self.tool_call_id,
                    name=self.name,
                    reasoning=self.reasoning,
                ),
            )

    @property
    def key(self) -> tuple[str, str]:
        """The record's name: (message id, digest)."""
        return self.msg_id, self.digest


def turn_from_message(message: BaseMessage, *, session: str, item: int | None) -> ArchivedTurn:
    """Archive form of a LangChain message: text, tool calls and reasoning kept apart."""
    if message.type not in ROLES:
        raise ConfigurationError(
            f"cannot archive a {message.type!r} message; expected one of {ROLES}"
        )
    tool_calls = getattr(message, "tool_calls", None) or []
    return ArchivedTurn(
        session=session,
        msg_id=message.id or "",
        item=item,
        role=message.type,
        content=text_of(message),
        tool_calls_json=json.dumps(list(tool_calls), ensure_ascii=False, default=str),
        tool_call_id=getattr(message, "tool_call_id", None),
        name=message.name,
        reasoning=reasoning_of(message),
    )


def _distinct_turns(session: str, turns: Sequence[ArchivedTurn]) -> list[ArchivedTurn]:
    """Turns in order, each msg_id once; two different turns under one id in one cut is a
    caller bug (a conversation in view never holds one id twice)."""
    seen: dict[str, ArchivedTurn] = {}
    for turn in turns:
        if turn.session != session:
            raise ConfigurationError(
                f"turn {turn.msg_id!r} is for session {turn.session!r}, not {session!r}"
            )
        first = seen.setdefault(turn.msg_id, turn)
        if first.digest != turn.digest:
            raise ConfigurationError(
                f"two different turns share msg_id {turn.msg_id!r} in one cut; "
                "give every message its own id"
            )
    return list(seen.values())


@dataclass(frozen=True, slots=True, kw_only=True)
class NotesDraft:
    """A NOTES version about to be saved with a cut."""

    first_item: int | None
    """The first item the notes account for; None while no item has arrived."""
    last_item: int | None
    """The last item the notes account for (inclusive)."""
    text: str
    """The rendered NOTES message text."""
    data_json: str = "{}"
    """The structured notes as JSON, for audits that must not parse the text."""

    def __post_init__(self) -> None:
        if (self.first_item is None) != (self.last_item is None):
            raise ConfigurationError("first_item and last_item must both be set or both be None")
        if (
            self.first_item is not None
            and self.last_item is not None
            and (self.first_item > self.last_item)
        ):
            raise ConfigurationError(
                f"first_item {self.first_item} is after last_item {self.last_item}"
            )
        _require_json(self.data_json, "data_json", object)


@dataclass(frozen=True, slots=True, kw_only=True)
class NotesVersion:
    """A saved NOTES version."""

    session: str
    """The session (thread) the NOTES belong to."""
    version: int
    """1-based, assigned by the store, one per cut that wrote notes."""
    first_item: int | None
    """The first item the NOTES cover (``Covers items first–last``); None before any item."""
    last_item: int | None
    """The last item the NOTES cover."""
    text: str
    """The NOTES block as the model reads it."""
    data_json: str
    """The NOTES as structured data (RULES, STATE, OPEN entries), JSON."""
    cut_key: str
    """The cut that wrote it."""
    created: float
    """Unix time of the commit."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MovedUpdate:
    """How a cut changes the session's moved STATE entries (``moved_rows`` describes them),
    applied in this order: ``drop``, then ``forget``, then ``add``."""

    drop: tuple[str, ...] = ()
    """Keys back in the NOTES: their rows go."""
    forget: tuple[str, ...] = ()
    """Keys that stay in the archive but whose value no longer applies (unset after a recall):
    the row stays without a value, so it is never recalled."""
    add: tuple[tuple[str, str | None], ...] = ()
    """Entries moved out now, in order, each with its latest value: a key moved before gets the
    new value and moves to the end of the order."""

    def __post_init__(self) -> None:
        for field, keys in (
            ("drop", self.drop),
            ("forget", self.forget),
            ("add", tuple(key for key, _ in self.add)),
        ):
            for key in keys:
                if not isinstance(key, str) or not key:
                    raise ConfigurationError(f"{field} keys must be non-empty strings, got {key!r}")
        for key, value in self.add:
            if value is not None and not isinstance(value, str):
                raise ArgumentTypeError(
                    f"the value of moved key {key!r} must be str or None, got {value!r}"
                )

    def __bool__(self) -> bool:
        return bool(self.drop or self.forget or self.add)


@dataclass(frozen=True, slots=True, kw_only=True)
class CutRecord:
    """What one committed cut did."""

    session: str
    cut_key: str
    turns_archived: int
    """Records this cut added; turns already archived on its branch are not counted, nor those
    another branch archived first (the cut links them instead of copying)."""
    notes_version: int | None
    """The NOTES version written with the cut, if any."""
    created: float
    parent: str | None = None
    """The cut before it on its branch (None: the first cut of the branch)."""
    ordinal: int = 0
    """1-based order of commit within the session (a child always after its parent)."""


@dataclass(frozen=True, slots=True)
class Chain:
    """What one branch of a session sees: the cuts from its head back to the first, and the
    records they archived or linked. Made by the store (``ArchiveStore.chain``)."""

    session: str
    head: str | None
    """The branch's latest cut (None: no cut yet)."""
    whole: bool
    """Every cut and record of the session is on it (a session that never forked, at its
    latest cut): nothing needs filtering."""
    ordinals: Spans = dataclasses.field(default_factory=lambda: _no_spans())
    """The ordinals of its cuts (0, before any cut, always)."""
    seqs: Spans = dataclasses.field(default_factory=lambda: _no_spans())
    """The ``seq`` of every record it sees, in the order the branch archived them (which is
    ``seq`` order unless it took up records another branch archived first)."""

    def sees(self, seq: int) -> bool:
        return self.whole or seq in self.seqs

    def rank(self, seq: int) -> int:
        """Where a record it sees stands in the branch's order (``seq`` itself when whole)."""
        return seq if self.whole else self.seqs.rank(seq)

    def holds_ordinal(self, ordinal: int) -> bool:
        return self.whole or ordinal in self.ordinals


def _no_spans() -> Spans:
    """No positions (imported here: the retrievers' package imports the SQLite archive, which
    imports this module)."""
    from keeper_middleware.retrievers.base import Spans

    return Spans()
