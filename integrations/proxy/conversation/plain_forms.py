"""The chat-completions form of a plain message, written directly (pure).

Almost every message a proxy sends upstream is plain: an agent's question, a model's reply with
its tool calls, a tool's result, each with text content. LangChain's
``convert_to_openai_messages`` gives their form through its general path (any message-like
input, content blocks of four providers), about twenty calls a message; a window's new messages
are rendered at every request. :func:`plain_form` writes the same dict for those messages alone
and leaves every other message (content blocks, a system message, a subclass) to LangChain, so
the upstream reads exactly what it read before.
"""

from __future__ import annotations

import json
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

__all__ = ["plain_form"]

_ROLES: dict[type[BaseMessage], str] = {
    AIMessage: "assistant",
    HumanMessage: "user",
    ToolMessage: "tool",
}
"""The message types written here (exactly these: a subclass may render otherwise)."""

_ARGUMENTS = json.JSONEncoder(ensure_ascii=False)
"""``json.dumps(args, ensure_ascii=False)``, as LangChain writes a tool call's arguments,
without making an encoder for each call."""


def plain_form(message: BaseMessage) -> dict[str, Any] | None:
    """``convert_to_openai_messages(message, text_format="string")`` for a plain message
    (an AI, human or tool message with text content); None for any other, to convert with
    LangChain."""
    role = _ROLES.get(type(message))
    content = message.content
    if role is None or type(content) is not str:
        return None
    form: dict[str, Any] = {"role": role}
    if message.name:
        form["name"] = message.name
    if role == "assistant":
        calls = message.tool_calls  # type: ignore[attr-defined]
        if calls:
            form["tool_calls"] = [
                {
                    "type": "function",
                    "id": call["id"],
                    "function": {
                        "name": call["name"],
                        "arguments": _ARGUMENTS.encode(call["args"]),
                    },
                }
                for call in calls
            ]
    refusal = message.additional_kwargs.get("refusal")
    if refusal:
        form["refusal"] = refusal
    if role == "tool":
        form["tool_call_id"] = message.tool_call_id  # type: ignore[attr-defined]
    form["content"] = content
    return form
