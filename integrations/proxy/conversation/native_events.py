"""What the Responses and Messages streams share (pure): the event lines a client is written,
the items a client's stream has open, and the reading of an upstream's stream up to its first
tool call (from there the reply may be an archive search the client must never see).

Each API's own writer (``client_events``) and reader (``upstream_events``) builds on these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from keeper_middleware.integrations.proxy.conversation.pieces import StreamPiece
from keeper_middleware.integrations.proxy.conversation.wire import item_id

__all__ = ["Forwarding", "Live", "NativeAssembler", "Writer", "sse"]


def sse(kind: str, payload: Mapping[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


@dataclass(slots=True)
class Live:
    """An item or block opened while the upstream streamed."""

    kind: str
    """``content`` (text) or ``reasoning_content``."""
    id: str
    call: object
    """The upstream call it came from (its envelope id)."""
    index: int
    text: str = ""


@dataclass
class Writer:
    """The items of one client stream, numbered across the upstream calls of its answer."""

    live: list[Live] = field(default_factory=list)
    count: int = 0

    def _live_for(self, piece: StreamPiece, kind: str, prefix: str) -> tuple[Live, bool]:
        """The item this piece's text goes to, and whether it is new."""
        call = piece.call
        if self.live:
            last = self.live[-1]
            if last.kind == kind and last.call == call and (piece.item in (None, last.id)):
                return last, False
        opened = Live(kind, piece.item or item_id(prefix), call, self.count)
        self.count += 1
        self.live.append(opened)
        return opened, True

    def _match(
        self, final_call: object, kind: str, taken: set[int], item: str | None
    ) -> Live | None:
        """The live item a final item of ``kind`` continues: the same id, or else the next one
        of its kind that the final upstream call opened."""
        for live in self.live:
            if live.index in taken or live.kind != kind:
                continue
            if (item is not None and live.id == item) or live.call == final_call:
                taken.add(live.index)
                return live
        return None


class NativeAssembler(Protocol):
    """What the upstream's stream loop needs of an assembler."""

    forwarded: dict[str, str]

    @property
    def complete(self) -> bool: ...

    def problem(self, event: Mapping[str, Any]) -> str | None:
        """The error an event reports (the stream failed), or None."""
        ...

    def feed(self, event: Mapping[str, Any]) -> StreamPiece | None: ...

    def completion(self) -> dict[str, Any]: ...


class Forwarding:
    """Text and reasoning passed on as they arrive, until a tool call begins."""

    def __init__(self) -> None:
        self.envelope: dict[str, Any] = {}
        self.forwarded: dict[str, str] = {}
        self.buffering = False

    def _piece(self, field: str, text: str, item: str | None = None) -> StreamPiece | None:
        if self.buffering or not text:
            return None
        self.forwarded[field] = self.forwarded.get(field, "") + text
        return StreamPiece({field: text}, None, dict(self.envelope), item)
