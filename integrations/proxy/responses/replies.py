"""Responses replies (pure): a Responses upstream's reply read into the chat completion the
keeper works on (its output items riding along), and an answer written back as a Responses
client's output items: the items the upstream sent when it speaks Responses, else items made
from the chat message.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from langchain_core.messages import AIMessage

from keeper_middleware.errors import MalformedDataError
from keeper_middleware.integrations.proxy.conversation.native import completion_of
from keeper_middleware.integrations.proxy.conversation.wire import ToolNames, item_id
from keeper_middleware.integrations.proxy.responses.requests import (
    MODEL_SIDE,
    assistant_from_items,
)

__all__ = ["chat_from_response", "output_message", "response_output", "responses_usage"]


def chat_from_response(response: Mapping[str, Any]) -> dict[str, Any]:
    """A Responses reply as the chat completion the keeper reads; its output items ride along
    (``message[WIRE_KEY]``) for the window copy and for a Responses client."""
    output = [i for i in response.get("output") or [] if isinstance(i, Mapping)]
    if not isinstance(response.get("output"), list):
        raise MalformedDataError("the upstream's response has no output list")
    message = assistant_from_items(output, 0) if output else AIMessage(content="")
    assert isinstance(message, AIMessage)
    status = response.get("status")
    details = response.get("incomplete_details") or {}
    if status not in (None, "completed", "incomplete"):
        raise MalformedDataError(f"the upstream's response has status {status!r}")

    def reason(calls: bool) -> str:
        if status == "incomplete":
            return "content_filter" if details.get("reason") == "content_filter" else "length"
        return "tool_calls" if calls else "stop"

    envelope = {
        k: response.get(k) for k in ("id", "model", "status", "usage", "incomplete_details")
    }
    usage = response.get("usage")
    chat_usage = None
    if isinstance(usage, Mapping):
        details_in = usage.get("input_tokens_details") or {}
        prompt = int(usage.get("input_tokens") or 0)
        output_tokens = int(usage.get("output_tokens") or 0)
        chat_usage = {
            "prompt_tokens": prompt,
            "completion_tokens": output_tokens,
            "total_tokens": int(usage.get("total_tokens") or prompt + output_tokens),
            "prompt_tokens_details": {"cached_tokens": int(details_in.get("cached_tokens") or 0)},
        }
    created = int(response.get("created_at") or time.time())
    return completion_of(
        message,
        api="responses",
        items=output,
        reply=envelope,
        reason=reason,
        usage=chat_usage,
        defaults=("resp-upstream", created),
    )


def responses_usage(usage: Mapping[str, Any] | None) -> dict[str, Any]:
    """A chat completion's usage in the Responses shape (every field the SDK requires)."""
    usage = usage or {}
    prompt = int(usage.get("prompt_tokens") or 0)
    output = int(usage.get("completion_tokens") or 0)
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    reasoning = int((usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": int(usage.get("total_tokens") or prompt + output),
    }


def response_output(
    message: Mapping[str, Any], wire: Mapping[str, Any] | None, names: ToolNames
) -> list[dict[str, Any]]:
    """The output items a Responses client gets for the agent's ``message`` (the upstream's
    message without the proxy's hidden calls): the upstream's own items when it speaks
    Responses, else items made from the message."""
    visible = {c.get("id") for c in message.get("tool_calls") or []}
    if wire is not None and wire.get("api") == "responses":
        return [
            dict(i)
            for i in wire.get("items") or []
            if i.get("type") not in MODEL_SIDE[1:] or i.get("call_id") in visible
        ]
    items: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        summary = [{"type": "summary_text", "text": reasoning}]
        items.append({"id": item_id("rs"), "type": "reasoning", "summary": summary})
    text = message.get("content")
    if isinstance(text, str) and text:
        items.append(output_message(item_id("msg"), text))
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        namespace, name = names.split(str(function.get("name") or ""))
        item: dict[str, Any] = {
            "id": item_id("fc"),
            "status": "completed",
            "call_id": call.get("id"),
        }
        if str(function.get("name")) in names.custom:
            try:
                given = json.loads(function.get("arguments") or "{}").get("input", "")
            except (ValueError, AttributeError):
                given = function.get("arguments") or ""
            item |= {"type": "custom_tool_call", "name": name, "input": str(given)}
        else:
            item |= {
                "type": "function_call",
                "name": name,
                "arguments": function.get("arguments") or "",
            }
        if namespace:
            item["namespace"] = namespace
        items.append(item)
    return items


def output_message(message_id: str, text: str) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
