"""Reading a Responses or a Messages upstream's event stream (pure).

Each assembler takes the stream's events one by one (the ``data:`` payloads; the ``event:`` line
repeats the payload's ``type``), passes on the text and the reasoning as they arrive until a tool
call begins (from there the reply may be an archive search the client must never see), and
builds the whole reply the API would have sent unstreamed, read into the chat completion the
keeper works on (:func:`~.responses_format.chat_from_response`,
:func:`~.messages_format.chat_from_message`). A stream that ends before the API's own end event
is not complete, whatever text it carried.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

from keeper_middleware.integrations.proxy.chat_completions.streams import StreamPiece
from keeper_middleware.integrations.proxy.messages.requests import chat_from_message
from keeper_middleware.integrations.proxy.responses.replies import chat_from_response

__all__ = ["MessagesAssembler", "NativeAssembler", "ResponsesAssembler"]


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


class _Forwarding:
    def __init__(self) -> None:
        self.envelope: dict[str, Any] = {}
        self.forwarded: dict[str, str] = {}
        self.buffering = False

    def _piece(self, field: str, text: str, item: str | None = None) -> StreamPiece | None:
        if self.buffering or not text:
            return None
        self.forwarded[field] = self.forwarded.get(field, "") + text
        return StreamPiece({field: text}, None, dict(self.envelope), item)


class ResponsesAssembler(_Forwarding):
    """A Responses stream: ``response.created`` … ``response.completed``."""

    def __init__(self) -> None:
        super().__init__()
        self.items: dict[int, dict[str, Any]] = {}
        self.final: dict[str, Any] | None = None

    @property
    def complete(self) -> bool:
        return self.final is not None

    def problem(self, event: Mapping[str, Any]) -> str | None:
        kind = event.get("type")
        if kind == "error":
            return str(event.get("message") or event.get("code") or event)
        if kind == "response.failed":
            error = (event.get("response") or {}).get("error") or {}
            return str(error.get("message") or error.get("code") or "the response failed")
        return None

    def feed(self, event: Mapping[str, Any]) -> StreamPiece | None:
        kind = event.get("type")
        response = event.get("response")
        if isinstance(response, Mapping) and not self.envelope:
            self.envelope = {
                "id": response.get("id"),
                "created": response.get("created_at"),
                "model": response.get("model"),
            }
        if kind in ("response.completed", "response.incomplete") and isinstance(response, Mapping):
            self.final = dict(response)
        elif kind == "response.output_item.added":
            item = event.get("item") or {}
            if item.get("type") not in ("message", "reasoning"):
                self.buffering = True
        elif kind == "response.output_item.done" and isinstance(event.get("item"), Mapping):
            self.items[int(event.get("output_index") or 0)] = dict(event["item"])
        elif kind == "response.output_text.delta":
            return self._piece("content", str(event.get("delta") or ""), event.get("item_id"))
        elif kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            text = str(event.get("delta") or "")
            return self._piece("reasoning_content", text, event.get("item_id"))
        return None

    def completion(self) -> dict[str, Any]:
        assert self.final is not None
        final = dict(self.final)
        if not final.get("output") and self.items:  # some servers leave the final output empty
            final["output"] = [self.items[i] for i in sorted(self.items)]
        return chat_from_response(final)


class MessagesAssembler(_Forwarding):
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
