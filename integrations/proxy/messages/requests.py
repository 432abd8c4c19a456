"""Anthropic Messages (``POST /v1/messages``) ⇄ the proxy's internal model (pure functions).

A request is read leniently (plain mappings: Claude Code sends beta fields and a
``role: "system"`` message inside the conversation that the SDK's param types do not all know):

- ``system`` (a string or text blocks) and every ``role: "system"`` message are the system
  prompt; the messages leave the conversation (Claude Code sends its environment that way, right
  after the first user message);
- a user message's ``tool_result`` blocks are one tool result each, its other blocks (text,
  images, documents) one user message, in the order they came;
- an assistant message is one assistant message: text, ``tool_use`` calls, and its
  ``thinking`` blocks (signatures included) riding along;
- the client's ``cache_control`` marks are dropped on the way in (Claude Code moves its mark to
  the newest block on every request; the proxy places its own breakpoints upstream).

Each message carries its blocks (``conversation.wire``), so a Messages upstream gets them as they came.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, SystemMessage, ToolMessage

from keeper_middleware.integrations.proxy.conversation.chat_messages import message_from_openai
from keeper_middleware.integrations.proxy.conversation.form import ChatRequest, RequestError
from keeper_middleware.integrations.proxy.conversation.native import (
    assistant_message,
    assistant_parts,
    chat_call,
    chat_function,
    image_source,
    native_request,
    own_items,
    tool_result,
)
from keeper_middleware.integrations.proxy.conversation.wire import (
    WireContext,
    attach,
    content_as_text,
    foreign_items,
    native_items,
)
from keeper_middleware.messages.facts import text_of
from keeper_middleware.search.schema import (
    SEARCH_TOOL_DESCRIPTION,
    SEARCH_TOOL_NAME,
    SEARCH_TOOL_PARAMETERS,
)

__all__ = [
    "MESSAGES_SEARCH_TOOL",
    "assistant_from_blocks",
    "merged",
    "messages_tools",
    "parse_messages_request",
    "render_messages",
    "tools_from_messages",
    "without_cache_marks",
]

MESSAGES_SEARCH_TOOL: dict[str, Any] = {
    "name": SEARCH_TOOL_NAME,
    "description": SEARCH_TOOL_DESCRIPTION,
    "input_schema": SEARCH_TOOL_PARAMETERS,
}
OWN_FIELDS = ("messages", "system", "tools", "stream")


def without_cache_marks(block: Any) -> Any:
    """A block without ``cache_control`` (also inside a tool result's own blocks)."""
    if not isinstance(block, Mapping):
        return block
    out = {k: v for k, v in block.items() if k != "cache_control"}
    if isinstance(out.get("content"), list):
        out["content"] = [without_cache_marks(b) for b in out["content"]]
    return out


# ---------------------------------------------------------------------------- tools


def tools_from_messages(raw: object) -> tuple[dict[str, Any], ...]:
    """The client's tools as chat functions (what the keeper counts and a chat upstream is
    offered); Anthropic's server tools (web search, ...) have no chat form."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(t, Mapping) for t in raw):
        raise RequestError("'tools' must be a list of tool objects.", param="tools")
    chat = []
    for tool in raw:
        if isinstance(tool.get("name"), str) and isinstance(tool.get("input_schema"), Mapping):
            chat.append(chat_function(tool["name"], tool["input_schema"], tool.get("description")))
    return tuple(chat)


def messages_tools(chat_tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Chat function tools as Messages tools (a chat client's tools, upstream)."""
    out = []
    for tool in chat_tools:
        function = tool.get("function") or {}
        item = {"name": function.get("name"), "input_schema": function.get("parameters") or {}}
        if function.get("description"):
            item["description"] = function["description"]
        out.append(item)
    return out


# ---------------------------------------------------------------------------- the request


def parse_messages_request(body: object) -> ChatRequest:
    """Read a ``POST /v1/messages`` body; a :class:`RequestError` says what is wrong."""
    if not isinstance(body, dict):
        raise RequestError("The request body must be a JSON object with 'messages'.")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw or not all(isinstance(m, Mapping) for m in raw):
        raise RequestError("'messages' must be a non-empty list of messages.", param="messages")
    system = body.get("system")
    if isinstance(system, str):
        system_blocks: list[Any] = [{"type": "text", "text": system}] if system else []
    elif isinstance(system, list):
        system_blocks = [without_cache_marks(b) for b in system]
    elif system is None:
        system_blocks = []
    else:
        raise RequestError("'system' must be a string or a list of text blocks.", param="system")
    messages: list[BaseMessage] = []
    for index, message in enumerate(raw):
        role, content = message.get("role"), message.get("content")
        if not isinstance(content, str | list):
            raise RequestError(
                f"messages[{index}].content must be a string or a list of blocks.",
                param=f"messages[{index}].content",
            )
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        blocks = [without_cache_marks(b) for b in blocks]
        if role == "system":
            system_blocks.append({"type": "text", "text": content_as_text(blocks)})
        elif role == "user":
            messages += _user(blocks, index)
        elif role == "assistant":
            messages.append(assistant_from_blocks(blocks, index))
        else:
            raise RequestError(
                f"messages[{index}].role must be user, assistant or system.",
                param=f"messages[{index}].role",
            )
    if not messages:
        raise RequestError("'messages' holds no user message.", param="messages")
    tools = body.get("tools") or []
    context = WireContext(
        api="messages",
        system_items=tuple(system_blocks),
        tools=tuple(without_cache_marks(t) for t in tools if isinstance(t, Mapping)),
    )
    return native_request(
        body,
        context=context,
        system_texts=[content_as_text([b]) for b in system_blocks],
        messages=messages,
        tools=tools_from_messages(body.get("tools")),
        own_fields=OWN_FIELDS,
    )


def _user(blocks: Sequence[Any], index: int) -> list[BaseMessage]:
    """A user message's blocks: each tool result a tool message, the rest user messages."""
    out: list[BaseMessage] = []
    pending: list[Any] = []

    def flush() -> None:
        if pending:
            chat = {"role": "user", "content": content_as_text(pending)}
            out.append(attach(message_from_openai(chat, index), "messages", pending, role="user"))
            pending.clear()

    for block in blocks:
        if isinstance(block, Mapping) and block.get("type") == "tool_result":
            flush()
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str) or not call_id:
                raise RequestError(
                    f"messages[{index}] has a tool_result without a 'tool_use_id'.",
                    param=f"messages[{index}].content",
                )
            result = tool_result(call_id, block.get("content"), index)
            out.append(attach(result, "messages", [block], role="user"))
        else:
            pending.append(block)
    flush()
    return out


def assistant_from_blocks(blocks: Sequence[Any], index: int) -> BaseMessage:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    thinking: list[str] = []
    for block in blocks:
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text") or ""))
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            calls.append(chat_call(block.get("id"), str(block.get("name") or ""), arguments))
        elif kind == "thinking":
            thinking.append(str(block.get("thinking") or ""))
    message = assistant_message(texts, calls, thinking, index)
    return attach(message, "messages", blocks, role="assistant")


# ---------------------------------------------------------------------------- to the upstream


def render_messages(message: BaseMessage) -> dict[str, Any]:
    """What a Messages upstream reads of one window message: ``{"role", "content": [blocks]}``
    (the body merges neighbours of one role). Blocks it came in as, when unchanged; else blocks
    made from its neutral part, keeping thinking blocks and the calls it still holds."""
    blocks = native_items(message, "messages")
    role = "assistant" if isinstance(message, AIMessage) else "user"
    if isinstance(message, SystemMessage):
        role = "system"
    if blocks is not None:
        return {"role": role, "content": blocks}
    template = own_items(message, "messages")
    text = text_of(message)
    if isinstance(message, ToolMessage):
        base = next((b for b in template if b.get("type") == "tool_result"), {})
        block = {
            **base,
            "type": "tool_result",
            "tool_use_id": message.tool_call_id,
            "content": text,
        }
        return {"role": "user", "content": [block]}
    if isinstance(message, AIMessage):
        return {"role": "assistant", "content": _assistant_blocks(message, template)}
    if role == "system":
        return {"role": "system", "content": text}
    return {"role": "user", "content": _user_blocks(message, text)}


def _assistant_blocks(message: AIMessage, template: list[Mapping[str, Any]]) -> list[Any]:
    def call(call_id: str | None, name: str | None, args: dict[str, Any] | str) -> dict[str, Any]:
        given = args if isinstance(args, dict) else {}  # a call that did not parse: no input
        return {"type": "tool_use", "id": call_id, "name": name, "input": given}

    return assistant_parts(
        message,
        template,
        kept=("thinking", "redacted_thinking"),
        calls=("tool_use",),
        id_key="id",
        text=lambda said: {"type": "text", "text": said},
        call=call,
    )


def _user_blocks(message: BaseMessage, text: str) -> list[dict[str, Any]]:
    """A user message's blocks: its images when it came through the Responses API unchanged."""
    found = foreign_items(message)
    if found is not None and found[0] == "responses":
        blocks: list[dict[str, Any]] = []
        for item in found[1]:
            content = item.get("content") if isinstance(item, Mapping) else None
            for part in content if isinstance(content, list) else []:
                if not isinstance(part, Mapping):
                    continue
                if part.get("type") in ("input_text", "text"):
                    blocks.append({"type": "text", "text": str(part.get("text") or "")})
                elif part.get("type") == "input_image" and isinstance(part.get("image_url"), str):
                    blocks.append(image_source(part["image_url"]))
        if blocks:
            return [b for b in blocks if b.get("type") != "text" or b["text"]]
    return [{"type": "text", "text": text}] if text else []


def merged(rendered: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rendered messages with neighbours of one role (user, assistant) merged into one message,
    as the Messages API takes them; a message left with no block is left out."""
    out: list[dict[str, Any]] = []
    for message in rendered:
        content = message["content"]
        if not content:
            continue
        role = message["role"]
        if out and role != "system" and out[-1]["role"] == role:
            out[-1] = {"role": role, "content": [*out[-1]["content"], *content]}
        else:
            out.append({"role": role, "content": list(content) if role != "system" else content})
    return out
