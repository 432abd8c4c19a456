"""What a message sends, as the texts a token counter counts (pure).

Every counter counts the same parts, so none leaves out what the request carries: the role, the
name, the text content (an image as a fixed cost, not its base64 data), each tool call's name,
JSON arguments and id, a tool result's call id, and the reasoning text; the tool schemas once per
request.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

__all__ = ["message_parts", "tools_json"]

_OPENAI_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}
_IMAGE_TYPES = ("image", "image_url", "input_image")

_ARGS_JSON = json.JSONEncoder(ensure_ascii=False)
"""``json.dumps(args, ensure_ascii=False)`` without making an encoder for each tool call."""


def message_parts(message: BaseMessage) -> tuple[list[str], int, int]:
    """Every text a message sends, its number of images and of tool calls.

    Images count as a fixed cost, not by the length of their base64 data.
    """
    parts = [_OPENAI_ROLES.get(message.type, message.type)]
    if message.name:
        parts.append(message.name)
    images = 0
    content = message.content
    for part in [content] if isinstance(content, str) else content:
        if isinstance(part, str):
            parts.append(part)
        elif part.get("type") == "text":
            parts.append(str(part.get("text", "")))
        elif part.get("type") in _IMAGE_TYPES:
            images += 1
        else:
            parts.append(json.dumps(part, ensure_ascii=False, default=str))
    calls: list[Any] = []
    if isinstance(message, AIMessage):
        calls = [*message.tool_calls, *message.invalid_tool_calls]
    for call in calls:
        args = call.get("args")
        parts.append(str(call.get("name") or ""))
        parts.append(args if isinstance(args, str) else _ARGS_JSON.encode(args))
        parts.append(str(call.get("id") or ""))
    if isinstance(message, ToolMessage):
        parts.append(message.tool_call_id)
    reasoning = message.additional_kwargs.get("reasoning_content")
    if isinstance(reasoning, str):
        parts.append(reasoning)
    return list(filter(None, parts)), images, len(calls)


_TOOLS_SEEN: dict[tuple[int, ...], tuple[Sequence[dict[str, Any]], str]] = {}
_TOOLS_KEPT = 64


def tools_json(tools: Sequence[dict[str, Any]]) -> str:
    """The tools as the request sends them. A step counts the same schemas several times (they
    are converted once, :class:`~keeper_middleware.model.setup.ModelSetup`, and never changed),
    so the text is remembered by the schemas' identity, holding them so no identity is reused."""
    key = tuple(map(id, tools))
    known = _TOOLS_SEEN.get(key)
    if known is not None and all(map(operator.is_, known[0], tools)):
        return known[1]
    text = "".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    if len(_TOOLS_SEEN) >= _TOOLS_KEPT:
        _TOOLS_SEEN.clear()
    _TOOLS_SEEN[key] = (tuple(tools), text)
    return text
