"""OpenAI Responses (``POST /v1/responses``) ⇄ the proxy's internal model (pure functions).

A request's ``input`` items are read leniently (plain mappings: real clients send what the SDK's
param types reject, such as Codex's ``content: null`` on an echoed reasoning item) into
chat-shaped messages, then LangChain messages carrying their items (``conversation.wire``):

- leading ``developer``/``system`` messages and ``instructions`` are the system prompt (Codex puts
  its whole prompt in two developer messages);
- consecutive model-side items (``reasoning``, assistant ``message``, ``function_call``,
  ``custom_tool_call`` and any item kind not known here) are one assistant message: reasoning
  travels with the call or text it led to;
- each ``function_call_output`` / ``custom_tool_call_output`` is one tool result;
- a namespaced function is the chat function ``<namespace>__<name>``, a custom tool a function
  of one string, ``input`` (:class:`~.wire.ToolNames`).

Replies (a Responses upstream's, read; the client's output, written) are in
:mod:`.replies`.
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
    image_url,
    native_request,
    own_items,
    tool_result,
)
from keeper_middleware.integrations.proxy.conversation.wire import (
    ToolNames,
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
    "RESPONSES_SEARCH_TOOL",
    "assistant_from_items",
    "parse_responses_request",
    "read_items",
    "render_responses",
    "responses_tools",
    "tools_from_responses",
]

RESPONSES_SEARCH_TOOL: dict[str, Any] = {
    "type": "function",
    "name": SEARCH_TOOL_NAME,
    "description": SEARCH_TOOL_DESCRIPTION,
    "parameters": SEARCH_TOOL_PARAMETERS,
    "strict": False,
}
REFUSED_FIELDS = {
    "background": "keeper-proxy answers every request in the foreground; leave 'background' out.",
    "conversation": "keeper-proxy keeps no conversation objects; send the items of the "
    "conversation in 'input' (it keeps the session itself).",
    "prompt": "keeper-proxy keeps no stored prompts; send the prompt's text as 'instructions'.",
}
OWN_FIELDS = ("input", "tools", "stream", "instructions", "stream_options")
_SYSTEM_ROLES = ("system", "developer")
MODEL_SIDE = ("reasoning", "function_call", "custom_tool_call")
_OUTPUTS = ("function_call_output", "custom_tool_call_output")
RIDING = (
    "web_search_call",
    "file_search_call",
    "computer_call",
    "computer_call_output",
    "code_interpreter_call",
    "image_generation_call",
    "local_shell_call",
    "local_shell_call_output",
    "shell_call",
    "shell_call_output",
    "apply_patch_call",
    "apply_patch_call_output",
    "mcp_list_tools",
    "mcp_approval_request",
    "mcp_approval_response",
    "mcp_call",
    "compaction",
    "compaction_summary",
)
"""Item types of the Responses API the keeper does not read: the model's own tools and their
results. They ride along with the assistant turn they belong to, untouched; any other type is
refused, so an item the proxy does not know is never sent upstream as an empty turn."""


# ---------------------------------------------------------------------------- tools


def tools_from_responses(raw: object) -> tuple[tuple[dict[str, Any], ...], ToolNames]:
    """The client's tools as chat functions (what the keeper counts, and what a chat upstream is
    offered) and the names to map calls back; built-in tools (web search, ...) have no chat form
    and are offered only to a Responses upstream."""
    if raw is None:
        return (), ToolNames()
    if not isinstance(raw, list) or not all(isinstance(t, Mapping) for t in raw):
        raise RequestError("'tools' must be a list of tool objects.", param="tools")
    chat: list[dict[str, Any]] = []
    namespaced: dict[str, tuple[str, str]] = {}
    custom: set[str] = set()

    def add(tool: Mapping[str, Any], namespace: str | None) -> None:
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            return
        flat = ToolNames.flat(namespace, name)
        if namespace:
            namespaced[flat] = (namespace, name)
        if tool.get("type") == "custom":
            custom.add(flat)
            parameters: Any = {
                "type": "object",
                "properties": {"input": {"type": "string"}},
                "required": ["input"],
            }
        else:
            parameters = tool.get("parameters") or {"type": "object", "properties": {}}
        chat.append(chat_function(flat, parameters, tool.get("description")))

    for tool in raw:
        if tool.get("type") in ("function", "custom"):
            add(tool, None)
        elif tool.get("type") == "namespace" and isinstance(tool.get("tools"), list):
            for inner in tool["tools"]:
                if isinstance(inner, Mapping) and inner.get("type") in ("function", "custom"):
                    add(inner, str(tool.get("name") or ""))
    return tuple(chat), ToolNames(namespaced, frozenset(custom))


def responses_tools(chat_tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Chat function tools as Responses function tools (a chat client's tools, upstream)."""
    out: list[dict[str, Any]] = []
    for tool in chat_tools:
        function = tool.get("function") or {}
        item = {"type": "function", "name": function.get("name")}
        item["parameters"] = function.get("parameters") or {"type": "object", "properties": {}}
        if function.get("description"):
            item["description"] = function["description"]
        if function.get("strict") is not None:
            item["strict"] = function["strict"]
        out.append(item)
    return out


# ---------------------------------------------------------------------------- the request


def parse_responses_request(body: object) -> ChatRequest:
    """Read a ``POST /v1/responses`` body; a :class:`RequestError` says what is wrong."""
    if not isinstance(body, dict):
        raise RequestError("The request body must be a JSON object with an 'input'.")
    for name, why in REFUSED_FIELDS.items():
        if body.get(name) not in (None, False, ""):
            raise RequestError(why, param=name)
    raw = body.get("input")
    if isinstance(raw, str):
        raw = [{"type": "message", "role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw or not all(isinstance(i, Mapping) for i in raw):
        raise RequestError("'input' must be a string or a non-empty list of items.", param="input")
    for index, item in enumerate(raw):
        if item.get("type") == "item_reference":
            raise RequestError(
                f"input[{index}] is an item_reference; keeper-proxy keeps no items to refer "
                "to: send the item itself.",
                param=f"input[{index}]",
            )
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise RequestError("'instructions' must be a string.", param="instructions")
    lead = 0
    while lead < len(raw) and _role(raw[lead]) in _SYSTEM_ROLES:
        lead += 1
    system_texts = [instructions] if instructions else []
    system_texts += [content_as_text(_parts(raw[i], i)) for i in range(lead)]
    chat_tools, names = tools_from_responses(body.get("tools"))
    messages = read_items(raw[lead:], names, lead)
    if not messages:
        raise RequestError(
            "'input' holds only system and developer messages; add the user's message.",
            param="input",
        )
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise RequestError("'previous_response_id' must be a string.", param="previous_response_id")
    context = WireContext(
        api="responses",
        instructions=instructions,
        system_items=tuple(dict(i) for i in raw[:lead]),
        tools=tuple(dict(t) for t in body.get("tools") or []),
        names=names,
    )
    return native_request(
        body,
        context=context,
        system_texts=system_texts,
        messages=messages,
        tools=chat_tools,
        own_fields=OWN_FIELDS,
    )


def _role(item: Mapping[str, Any]) -> str | None:
    kind = item.get("type", "message")
    return str(item.get("role")) if kind == "message" else None


def _parts(item: Mapping[str, Any], index: int) -> str | list[Any]:
    content = item.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return content
    raise RequestError(
        f"input[{index}].content must be a string or a list of content parts.",
        param=f"input[{index}].content",
    )


def read_items(
    items: Sequence[Mapping[str, Any]], names: ToolNames, first: int
) -> list[BaseMessage]:
    """Input items (after the system part) as LangChain messages carrying their items."""
    messages: list[BaseMessage] = []
    group: list[Mapping[str, Any]] = []

    def flush() -> None:
        if group:
            messages.append(assistant_from_items(group, first + len(messages)))
            group.clear()

    for offset, item in enumerate(items):
        index = first + offset
        kind = item.get("type", "message")
        role = item.get("role") if kind == "message" else None
        if kind in MODEL_SIDE or role == "assistant":
            group.append(item)
        elif kind in _OUTPUTS:
            flush()
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise RequestError(
                    f"input[{index}] is a tool output without a 'call_id'.",
                    param=f"input[{index}].call_id",
                )
            result = tool_result(call_id, item.get("output"), index)
            messages.append(attach(result, "responses", [item]))
        elif kind == "message" and role in ("user", *_SYSTEM_ROLES):
            flush()
            text = content_as_text(_parts(item, index))
            chat = {"role": role, "content": text}
            messages.append(attach(message_from_openai(chat, index), "responses", [item]))
        elif kind == "message":
            raise RequestError(
                f"input[{index}].role must be user, assistant, system or developer.",
                param=f"input[{index}].role",
            )
        elif (
            kind in RIDING
        ):  # the model's own tools (web search, shell calls, ...): they ride along
            group.append(item)
        else:
            raise RequestError(
                f"input[{index}] has type {kind!r}, which keeper-proxy does not know; send "
                f"message, {', '.join(MODEL_SIDE)}, {', '.join(_OUTPUTS)} or one of the "
                "Responses API's tool items.",
                param=f"input[{index}].type",
            )
    flush()
    return messages


def assistant_from_items(items: Sequence[Mapping[str, Any]], index: int) -> BaseMessage:
    """Model-side items as one assistant message: text, tool calls, reasoning."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            texts.append(_output_text(item.get("content")))
        elif kind == "function_call":
            name = ToolNames.flat(item.get("namespace"), str(item.get("name") or ""))
            calls.append(chat_call(item.get("call_id"), name, item.get("arguments")))
        elif kind == "custom_tool_call":
            arguments = json.dumps({"input": item.get("input") or ""}, ensure_ascii=False)
            calls.append(chat_call(item.get("call_id"), str(item.get("name") or ""), arguments))
        elif kind == "reasoning":
            reasoning.append(_summary_text(item))
    return attach(assistant_message(texts, calls, reasoning, index), "responses", items)


def _output_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "".join(
        str(p.get("text") or "")
        for p in content
        if isinstance(p, Mapping) and p.get("type") in ("output_text", "text", "input_text")
    )


def _summary_text(item: Mapping[str, Any]) -> str:
    parts = [*(item.get("summary") or []), *(item.get("content") or [])]
    return "\n".join(str(p.get("text") or "") for p in parts if isinstance(p, Mapping))


# ---------------------------------------------------------------------------- to the upstream


def render_responses(message: BaseMessage) -> dict[str, Any]:
    """What a Responses upstream reads of one window message: ``{"items": [...]}``. Items it came
    in as, when unchanged; else items made from its neutral part, keeping what the keeper did
    not change (reasoning, the ids of calls it still holds)."""
    items = native_items(message, "responses")
    if items is not None:
        return {"items": items}
    template = own_items(message, "responses")
    text = text_of(message)
    if isinstance(message, ToolMessage):
        base = next((i for i in template if i.get("type") in _OUTPUTS), None)
        kind = base.get("type") if base else "function_call_output"
        return {"items": [{"type": kind, "call_id": message.tool_call_id, "output": text}]}
    if isinstance(message, AIMessage):
        return {"items": _assistant_items(message, template)}
    role = "developer" if isinstance(message, SystemMessage) else "user"
    return {"items": [{"type": "message", "role": role, "content": _input_parts(message, text)}]}


def _assistant_items(message: AIMessage, template: list[Mapping[str, Any]]) -> list[Any]:
    def call(call_id: str | None, name: str | None, args: dict[str, Any] | str) -> dict[str, Any]:
        arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        return {"type": "function_call", "call_id": call_id or "", "name": name or "",
                "arguments": arguments}  # fmt: skip

    return assistant_parts(
        message,
        template,
        kept=("reasoning",),
        calls=MODEL_SIDE[1:],
        id_key="call_id",
        text=lambda said: {"type": "message", "role": "assistant", "content": said},
        call=call,
    )


def _input_parts(message: BaseMessage, text: str) -> list[dict[str, Any]]:
    """A user message's parts: its images when it came through another API unchanged."""
    found = foreign_items(message)
    if found is not None and found[0] == "messages":
        parts: list[dict[str, Any]] = []
        for block in found[1]:
            if not isinstance(block, Mapping):
                continue
            if block.get("type") == "text":
                parts.append({"type": "input_text", "text": str(block.get("text") or "")})
            elif block.get("type") == "image" and (url := image_url(block)):
                parts.append({"type": "input_image", "image_url": url, "detail": "auto"})
        if parts:
            return parts
    return [{"type": "input_text", "text": text}]
