"""Reading a Messages upstream's event stream (pure): ``message_start``, content blocks,
``message_delta``, ``message_stop``. The text and the reasoning are passed on as they arrive
until a tool call begins; the whole reply is built as the API would have sent it unstreamed and
read into the chat completion the keeper works on (:func:`~.replies.chat_from_message`). A stream
that ends before ``message_stop`` is not complete, whatever text it carried.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from keeper_middleware.integrations.proxy.conversation.native_events import Forwarding
from keeper_middleware.integrations.proxy.conversation.pieces import StreamPiece
from keeper_middleware.integrations.proxy.messages.replies import chat_from_message

__all__ = ["MessagesAssembler"]


class MessagesAssembler(Forwarding):
    """A Messages stream: ``message_start``, content blocks, ``message_delta``,
    ``message_stop``."""

    def __init__(self) -> None:
        super().__init__()
        self.message: dict[str, Any] = {}
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial: dict[int, list[str]] = {}
        self.stopped = False

    @property
    def complete(self) -> bool:
        return self.stopped or self.message.get("stop_reason") is not None

    def problem(self, event: Mapping[str, Any]) -> str | None:
        if event.get("type") == "error":
            error = event.get("error") or {}
            return str(error.get("message") or error.get("type") or event)
        return None

    def feed(self, event: Mapping[str, Any]) -> StreamPiece | None:
        kind = event.get("type")
        if kind == "message_start" and isinstance(event.get("message"), Mapping):
            self.message = dict(event["message"])
            self.envelope = {"id": self.message.get("id"), "model": self.message.get("model")}
        elif kind == "content_block_start" and isinstance(event.get("content_block"), Mapping):
            block = dict(event["content_block"])
            self.blocks[int(event.get("index") or 0)] = block
            if block.get("type") not in ("text", "thinking", "redacted_thinking"):
                self.buffering = True
        elif kind == "content_block_delta":
            return self._delta(int(event.get("index") or 0), event.get("delta") or {})
        elif kind == "content_block_stop":
            index = int(event.get("index") or 0)
            closed = self.blocks.get(index)
            if closed is not None and index in self.partial:
                raw = "".join(self.partial.pop(index)).strip()
                closed["input"] = json.loads(raw) if raw else {}
        elif kind == "message_delta":
            delta = event.get("delta") or {}
            for key in ("stop_reason", "stop_sequence"):
                if key in delta:
                    self.message[key] = delta[key]
            if isinstance(event.get("usage"), Mapping):
                usage = dict(self.message.get("usage") or {})
                usage.update({k: v for k, v in event["usage"].items() if v is not None})
                self.message["usage"] = usage
        elif kind == "message_stop":
            self.stopped = True
        return None

    def _delta(self, index: int, delta: Mapping[str, Any]) -> StreamPiece | None:
        block = self.blocks.setdefault(index, {"type": "text", "text": ""})
        kind = delta.get("type")
        if kind == "text_delta":
            text = str(delta.get("text") or "")
            block["text"] = str(block.get("text") or "") + text
            return self._piece("content", text)
        if kind == "thinking_delta":
            text = str(delta.get("thinking") or "")
            block["thinking"] = str(block.get("thinking") or "") + text
            return self._piece("reasoning_content", text)
        if kind == "signature_delta":
            block["signature"] = str(block.get("signature") or "") + str(delta.get("signature"))
        elif kind == "input_json_delta":
            self.partial.setdefault(index, []).append(str(delta.get("partial_json") or ""))
        return None

    def completion(self) -> dict[str, Any]:
        for index in list(self.partial):  # a tool call whose block was never closed
            raw = "".join(self.partial.pop(index)).strip()
            self.blocks[index]["input"] = json.loads(raw) if raw else {}
        reply = {**self.message, "content": [self.blocks[i] for i in sorted(self.blocks)]}
        return chat_from_message(reply)
