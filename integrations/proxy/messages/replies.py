"""Messages replies (pure): a Messages upstream's reply read into the chat completion the keeper
works on (its content blocks riding along), and an answer written back as a Messages client's
content blocks, usage and stop reason: the upstream's own when it speaks Messages, else made
from the chat message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from langchain_core.messages import AIMessage

from keeper_middleware.errors import MalformedDataError
from keeper_middleware.integrations.proxy.conversation.native import completion_of
from keeper_middleware.integrations.proxy.messages.requests import assistant_from_blocks

__all__ = ["STOP_REASONS", "chat_from_message", "message_blocks", "messages_usage", "stop_reason"]

STOP_REASONS = {"tool_calls": "tool_use", "length": "max_tokens", "stop": "end_turn"}
_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_calls",
           "max_tokens": "length", "refusal": "content_filter", "pause_turn": "stop"}  # fmt: skip


def chat_from_message(reply: Mapping[str, Any]) -> dict[str, Any]:
    """A Messages reply as the chat completion the keeper reads; its blocks ride along."""
    content = reply.get("content")
    if not isinstance(content, list):
        raise MalformedDataError("the upstream's message has no content list")
    message = assistant_from_blocks(content, 0)
    assert isinstance(message, AIMessage)
    envelope = {k: reply.get(k) for k in ("id", "model", "stop_reason", "stop_sequence", "usage")}
    usage = reply.get("usage")
    chat_usage = None
    if isinstance(usage, Mapping):
        read = int(usage.get("cache_read_input_tokens") or 0)
        prompt = int(usage.get("input_tokens") or 0) + read
        prompt += int(usage.get("cache_creation_input_tokens") or 0)
        output = int(usage.get("output_tokens") or 0)
        chat_usage = {
            "prompt_tokens": prompt,
            "completion_tokens": output,
            "total_tokens": prompt + output,
            "prompt_tokens_details": {"cached_tokens": read},
        }
    stop = str(reply.get("stop_reason"))
    return completion_of(
        message,
        api="messages",
        items=list(content),
        reply=envelope,
        reason=lambda calls: _FINISH.get(stop, "tool_calls" if calls else "stop"),
        usage=chat_usage,
        defaults=("msg-upstream", 0),
    )


def messages_usage(
    usage: Mapping[str, Any] | None, wire: Mapping[str, Any] | None
) -> dict[str, Any]:
    """A Messages client's usage: the upstream's own when it speaks Messages, else the chat
    usage split into uncached input and cache reads."""
    if wire is not None and wire.get("api") == "messages":
        native = (wire.get("reply") or {}).get("usage")
        if isinstance(native, Mapping):
            return dict(native)
    usage = usage or {}
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return {
        "input_tokens": max(0, int(usage.get("prompt_tokens") or 0) - cached),
        "output_tokens": int(usage.get("completion_tokens") or 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def message_blocks(
    message: Mapping[str, Any], wire: Mapping[str, Any] | None
) -> list[dict[str, Any]]:
    """The content blocks a Messages client gets for the agent's ``message`` (without the
    proxy's hidden calls): the upstream's blocks when it speaks Messages, else blocks made from
    the message (reasoning from another API is not shown: it has no signature)."""
    visible = {c.get("id") for c in message.get("tool_calls") or []}
    if wire is not None and wire.get("api") == "messages":
        return [
            dict(b)
            for b in wire.get("items") or []
            if b.get("type") != "tool_use" or b.get("id") in visible
        ]
    blocks: list[dict[str, Any]] = []
    text = message.get("content")
    if isinstance(text, str) and text:
        blocks.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        raw = function.get("arguments") or "{}"
        try:
            given = json.loads(raw)
        except ValueError:
            given = None
        blocks.append(
            {
                "type": "tool_use",
                "id": call.get("id"),
                "name": function.get("name"),
                "input": given if isinstance(given, dict) else {"arguments": raw},
            }
        )
    return blocks


def stop_reason(reason: str, wire: Mapping[str, Any] | None) -> str:
    """The Messages stop reason for a chat finish reason (the upstream's own when it agrees)."""
    mapped = STOP_REASONS.get(reason, "end_turn")
    if reason == "content_filter":
        mapped = "refusal"
    native = (wire or {}).get("reply", {}).get("stop_reason") if wire else None
    if isinstance(native, str) and _FINISH.get(native) == reason:
        return native
    return mapped
