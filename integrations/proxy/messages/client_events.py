"""Server-sent events to a Messages client (pure): ``message_start``, per content block
``content_block_start``, its deltas, ``content_block_stop``, then ``message_delta`` (stop
reason, usage) and ``message_stop``. Claude Code needs the start and stop of every block.

One client response can span several upstream calls (the proxy's archive searches run between
them): blocks are numbered across all of them (``index``), text one call passed on stays in the
block it opened, and the answer's own blocks follow, so the client sees one coherent message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from keeper_middleware.integrations.proxy.conversation.native_events import Writer, sse
from keeper_middleware.integrations.proxy.conversation.pieces import StreamPiece

__all__ = ["MessagesWriter"]


@dataclass
class MessagesWriter(Writer):
    """One streamed Messages answer. Reasoning is shown only as the upstream's own thinking
    blocks (they carry a signature); another API's reasoning is not passed on."""

    start_message: dict[str, Any] = field(default_factory=dict)
    show_thinking: bool = False

    def start(self) -> bytes:
        message = {**self.start_message, "content": [], "stop_reason": None, "stop_sequence": None}
        return sse("message_start", {"type": "message_start", "message": message}) + sse(
            "ping", {"type": "ping"}
        )

    def piece(self, piece: StreamPiece) -> bytes:
        out = b""
        for field_name, text in piece.delta.items():
            kind = "content" if field_name == "content" else "reasoning_content"
            if kind != "content" and not self.show_thinking:
                continue
            live, new = self._live_for(piece, kind, "blk")
            if new:
                opening = {"type": "text", "text": ""} if kind == "content" else {
                    "type": "thinking", "thinking": "", "signature": ""}  # fmt: skip
                out += sse(
                    "content_block_start",
                    {"type": "content_block_start", "index": live.index, "content_block": opening},
                )
            live.text += text
            delta = {"type": "text_delta", "text": text} if kind == "content" else {
                "type": "thinking_delta", "thinking": text}  # fmt: skip
            out += _block_event("content_block_delta", live.index, delta=delta)
        return out

    def finish(
        self,
        blocks: Sequence[Mapping[str, Any]],
        final_call: object,
        stop: str,
        usage: Mapping[str, Any],
    ) -> bytes:
        out = b""
        taken: set[int] = set()
        matched: dict[int, Mapping[str, Any]] = {}
        rest: list[Mapping[str, Any]] = []
        for block in blocks:
            kind = {"text": "content", "thinking": "reasoning_content"}.get(str(block.get("type")))
            live = None if kind is None else self._match(final_call, kind, taken, None)
            if live is None:
                rest.append(block)
            else:
                matched[live.index] = block
        for live in self.live:
            final = matched.get(live.index)
            if final is not None and live.kind == "content":
                text = str(final.get("text") or "")
                if text.startswith(live.text) and len(text) > len(live.text):
                    more = {"type": "text_delta", "text": text[len(live.text) :]}
                    out += _block_event("content_block_delta", live.index, delta=more)
            elif final is not None and final.get("signature"):
                signed = {"type": "signature_delta", "signature": final["signature"]}
                out += _block_event("content_block_delta", live.index, delta=signed)
            out += _block_event("content_block_stop", live.index)
        for block in rest:
            out += self._whole(dict(block))
        ending = {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                  "usage": dict(usage)}  # fmt: skip
        return out + sse("message_delta", ending) + sse("message_stop", {"type": "message_stop"})

    def _whole(self, block: dict[str, Any]) -> bytes:
        index = self.count
        self.count += 1
        kind = block.get("type")
        if kind == "text":
            opening: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": block.get("text") or ""}]
        elif kind == "thinking":
            opening = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": block.get("thinking") or ""},
                      {"type": "signature_delta", "signature": block.get("signature") or ""}]  # fmt: skip
        elif kind == "tool_use":
            opening = {**block, "input": {}}
            raw = orjson.dumps(block.get("input") or {}).decode()
            deltas = [{"type": "input_json_delta", "partial_json": raw}]
        else:  # redacted thinking, server tool blocks: whole in the start event
            opening, deltas = block, []
        out = sse(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": opening},
        )
        for delta in deltas:
            out += _block_event("content_block_delta", index, delta=delta)
        return out + _block_event("content_block_stop", index)

    @staticmethod
    def failed(error: Mapping[str, Any]) -> bytes:
        return sse("error", {"type": "error", "error": dict(error)})


def _block_event(kind: str, index: int, **fields: Any) -> bytes:
    return sse(kind, {"type": kind, "index": index, **fields})
