"""The rows a cut writes, the same in every SQL store (pure).

SQLite and PostgreSQL keep one table layout and write a cut alike: the cut's record, the NOTES
version written with it, and the turns not archived before, numbered on from the session's last
sequence number. Only the placeholders, the transaction and how long texts are encoded differ,
so the rows are built here once and each store only runs its statements.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from keeper_middleware.archive.records import ArchivedTurn, CutRecord, NotesDraft
from keeper_middleware.errors import ConfigurationError

TURN_COLUMNS = (
    "session, msg_id, item, role, content, tool_calls_json, tool_call_id, name, reasoning, seq"
)
NOTES_COLUMNS = "session, version, first_item, last_item, text, data_json, cut_key, created"
CUT_COLUMNS = "session, cut_key, turns_archived, notes_version, created"


def require_cut_key(cut_key: str) -> None:
    if not isinstance(cut_key, str) or not cut_key:
        raise ConfigurationError(f"cut_key must be a non-empty string, got {cut_key!r}")


@dataclass(frozen=True, slots=True)
class CutRows:
    """What one cut inserts, in the columns' order (turn rows end with their ``cut_key``)."""

    record: CutRecord
    cut: tuple[object, ...]
    notes: tuple[object, ...] | None
    turns: list[tuple[object, ...]]


def cut_rows(
    session: str,
    cut_key: str,
    new: Sequence[ArchivedTurn],
    notes: NotesDraft | None,
    *,
    notes_version: int | None,
    first_seq: int,
    created: float,
    text: Callable[[str], object] = lambda kept: kept,
) -> CutRows:
    """The rows of a cut that archives ``new`` (the turns no earlier cut archived) and writes
    ``notes`` as ``notes_version``; ``text`` encodes the long texts as the store keeps them."""
    record = CutRecord(
        session=session,
        cut_key=cut_key,
        turns_archived=len(new),
        notes_version=notes_version,
        created=created,
    )
    notes_row = None
    if notes is not None:
        notes_row = (
            session,
            notes_version,
            notes.first_item,
            notes.last_item,
            text(notes.text),
            notes.data_json,
            cut_key,
            created,
        )
    turn_rows: list[tuple[object, ...]] = [
        (
            session,
            t.msg_id,
            t.item,
            t.role,
            text(t.content),
            t.tool_calls_json,
            t.tool_call_id,
            t.name,
            text(t.reasoning),
            first_seq + i,
            cut_key,
        )
        for i, t in enumerate(new)
    ]
    cut_row = (session, cut_key, record.turns_archived, record.notes_version, record.created)
    return CutRows(record=record, cut=cut_row, notes=notes_row, turns=turn_rows)
