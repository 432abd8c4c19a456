"""Reading a Responses upstream's event stream (pure): ``response.created`` …
``response.completed``. The text and the reasoning are passed on as they arrive until a tool call
begins; the whole reply is built as the API would have sent it unstreamed and read into the chat
completion the keeper works on (:func:`~.replies.chat_from_response`). A stream that ends before
``response.completed`` is not complete, whatever text it carried.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from keeper_middleware.integrations.proxy.conversation.native_events import Forwarding
from keeper_middleware.integrations.proxy.conversation.pieces import StreamPiece
from keeper_middleware.integrations.proxy.responses.replies import chat_from_response

__all__ = ["ResponsesAssembler"]


class ResponsesAssembler(Forwarding):
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
