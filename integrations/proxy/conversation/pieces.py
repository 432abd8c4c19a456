"""What one upstream chunk gives the client at once, in whichever API the upstream streams: the
unit every stream reader passes on and every stream writer takes (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["StreamPiece"]


@dataclass(frozen=True, slots=True)
class StreamPiece:
    """What one upstream chunk gives the agent at once."""

    delta: dict[str, str]
    """Text per field (``content``, ``reasoning_content``, ``reasoning``)."""
    logprobs: Any
    """The chunk's ``logprobs`` as the upstream sent it (None when it sent none)."""
    envelope: Mapping[str, Any]
    """The stream's envelope, from its first chunk."""
    item: str | None = None
    """The upstream's id of the output item the text belongs to (Responses), when it has one."""
    call: int = 0
    """Which upstream work call of the request it came from (set for the Responses and
    Messages front doors, which keep each call's text in items of its own)."""
