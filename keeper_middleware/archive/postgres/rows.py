"""How the PostgreSQL archive's values travel: text as UTF-8 bytes that keep lone surrogates
(any message a model or a tool sends is stored word for word), NUL refused where PostgreSQL's
text columns cannot hold it, and each row read back as the contract's record.

Kept apart from ``archive`` so the backend's transactions read without the row plumbing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from keeper_middleware.archive.records import ArchivedTurn, CutRecord, NotesVersion
from keeper_middleware.errors import ConfigurationError


def encoded(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def decoded(data: bytes | memoryview) -> str:
    return bytes(data).decode("utf-8", "surrogatepass")


def refuse_nul(value: str | None, field: str) -> None:
    if value is not None and "\x00" in value:
        raise ConfigurationError(
            f"{field} {value!r:.60} holds a NUL character; use an id without one"
        )


def turn_from_row(row: Sequence[Any]) -> ArchivedTurn:
    session, msg_id, item, role, content, calls, call_id, name, reasoning, seq, digest = row
    return ArchivedTurn(
        session=session,
        msg_id=msg_id,
        item=item,
        role=role,
        content=decoded(content),
        tool_calls_json=calls,
        tool_call_id=call_id,
        name=name,
        reasoning=decoded(reasoning),
        seq=seq,
        digest=digest,
    )


def notes_from_row(row: Sequence[Any]) -> NotesVersion:
    session, version, first, last, text, data_json, key, created = row
    return NotesVersion(
        session=session,
        version=version,
        first_item=first,
        last_item=last,
        text=decoded(text),
        data_json=data_json,
        cut_key=key,
        created=created,
    )


def cut_from_row(row: Sequence[Any]) -> CutRecord:
    session, key, archived, version, created, parent, ordinal = row
    return CutRecord(
        session=session,
        cut_key=key,
        turns_archived=archived,
        notes_version=version,
        created=created,
        parent=parent,
        ordinal=ordinal,
    )
