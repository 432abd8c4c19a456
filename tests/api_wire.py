"""The three wire formats the scripted upstream speaks: OpenAI Chat Completions, OpenAI Responses
and Anthropic Messages, streamed (server-sent events) and not.

``read_*`` turns a request body into the scripted model's ``Turn``; ``*_body`` and ``*_events``
render a ``Reply`` the way each API's server does, with the fields and the event order its
clients rely on (recorded against Codex CLI 0.169.0, Claude Code 2.1.328, openai-agents 0.24 and
the anthropic SDK 2.15; ``tests/test_agent_upstream.py`` checks every event against the official
SDK types). ``sse`` frames a list of events.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from tests.coding_session import (
    AssistantText,
    Item,
    Reply,
    ToolCall,
    ToolResult,
    Turn,
    UserText,
    arguments_json,
)

MODEL = "scripted-model"


def text_of(content: Any) -> str:
    """The text of a content field: a string, or a list of text-bearing parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(text_of(part) for part in content)
    if isinstance(content, Mapping):
        if "text" in content:
            return str(content["text"])
        if "content" in content:
            return text_of(content["content"])
        return ""
    return str(content)


def loads_arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, Mapping):
        return dict(raw)
    try:
        value = json.loads(raw or "{}")
    except json.JSONDecodeError:
        return {"_raw": raw}
    return value if isinstance(value, dict) else {"_raw": value}


def sse(
    events: Iterable[tuple[str | None, Mapping[str, Any]]], done: bool = False
) -> Iterator[bytes]:
    """Server-sent events: ``event:`` lines where the API names its events, then ``data:``."""
    for name, data in events:
        head = f"event: {name}\n" if name else ""
        yield f"{head}data: {json.dumps(data)}\n\n".encode()
    if done:
        yield b"data: [DONE]\n\n"


def usage_tokens(body: Mapping[str, Any]) -> int:
    """A rough prompt size (4 characters a token), so clients see usage that grows."""
    return max(1, len(json.dumps(body)) // 4)


# ----------------------------------------------------------------------------- Chat Completions


def read_chat(body: Mapping[str, Any]) -> Turn:
    system: list[str] = []
    items: list[Item] = []
    for message in body.get("messages") or []:
        role = message.get("role")
        if role in ("system", "developer"):
            system.append(text_of(message.get("content")))
        elif role == "user":
            items.append(UserText(text_of(message.get("content"))))
        elif role == "assistant":
            if message.get("content"):
                items.append(AssistantText(text_of(message["content"])))
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                items.append(
                    ToolCall(
                        call["id"],
                        function.get("name", ""),
                        loads_arguments(function.get("arguments")),
                    )
                )
        elif role == "tool":
            items.append(
                ToolResult(message.get("tool_call_id", ""), text_of(message.get("content")))
            )
    tools = tuple((tool.get("function") or {}).get("name", "") for tool in body.get("tools") or [])
    return Turn("\n".join(system), tuple(items), tools)


def chat_body(reply: Reply, body: Mapping[str, Any], serial: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text}
    if reply.calls:
        message["tool_calls"] = [
            {
                "id": call.call_id,
                "type": "function",
                "function": {"name": call.name, "arguments": arguments_json(call)},
            }
            for call in reply.calls
        ]
    prompt = usage_tokens(body)
    return {
        "id": f"chatcmpl-{serial}",
        "object": "chat.completion",
        "created": 1,
        "model": body.get("model") or MODEL,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if reply.calls else "stop",
            }
        ],
        "usage": {"prompt_tokens": prompt, "completion_tokens": 10, "total_tokens": prompt + 10},
    }


def chat_events(
    reply: Reply, body: Mapping[str, Any], serial: int
) -> list[tuple[None, dict[str, Any]]]:
    whole = chat_body(reply, body, serial)
    envelope = {k: whole[k] for k in ("id", "created", "model")} | {
        "object": "chat.completion.chunk"
    }

    def chunk(delta: dict[str, Any], reason: str | None = None) -> tuple[None, dict[str, Any]]:
        choice = {"index": 0, "delta": delta, "finish_reason": reason}
        return None, {**envelope, "choices": [choice]}

    out = [chunk({"role": "assistant", "content": ""})]
    text = reply.text or ""
    out += [chunk({"content": text[i : i + 16]}) for i in range(0, len(text), 16)]
    for index, call in enumerate(reply.calls):
        head = {"index": index, "id": call.call_id, "type": "function"}
        out.append(
            chunk({"tool_calls": [{**head, "function": {"name": call.name, "arguments": ""}}]})
        )
        args = arguments_json(call)
        out += [
            chunk({"tool_calls": [{"index": index, "function": {"arguments": args[i : i + 16]}}]})
            for i in range(0, len(args), 16)
        ]
    out.append(chunk({}, whole["choices"][0]["finish_reason"]))
    out.append((None, {**envelope, "choices": [], "usage": whole["usage"]}))
    return out


# ----------------------------------------------------------------------------- Responses


def read_responses(body: Mapping[str, Any]) -> Turn:
    system = [text_of(body.get("instructions"))] if body.get("instructions") else []
    items: list[Item] = []
    entries = body.get("input") or []
    if isinstance(entries, str):
        entries = [{"type": "message", "role": "user", "content": entries}]
    for entry in entries:
        kind = entry.get("type", "message")
        if kind == "message":
            role, text = entry.get("role"), text_of(entry.get("content"))
            if role in ("system", "developer"):
                system.append(text)
            elif role == "user":
                items.append(UserText(text))
            elif role == "assistant":
                items.append(AssistantText(text))
        elif kind in ("function_call", "custom_tool_call"):
            raw = entry.get("arguments", entry.get("input"))
            items.append(
                ToolCall(entry.get("call_id", ""), entry.get("name", ""), loads_arguments(raw))
            )
        elif kind in ("function_call_output", "custom_tool_call_output"):
            items.append(ToolResult(entry.get("call_id", ""), text_of(entry.get("output"))))
    return Turn("\n".join(system), tuple(items), tuple(tool_names(body.get("tools") or [])))


def tool_names(tools: Iterable[Mapping[str, Any]]) -> Iterator[str]:
    """Function tools by name, a namespace's tools by theirs, built-in tools by type."""
    for tool in tools:
        if tool.get("type") == "namespace":
            yield from tool_names(tool.get("tools") or [])
        else:
            yield str(tool.get("name") or tool.get("type"))


def responses_items(reply: Reply, serial: int) -> list[dict[str, Any]]:
    """The output items of a reply, complete, in the order they stream."""
    items: list[dict[str, Any]] = []
    if reply.reasoning:
        items.append(
            {
                "id": f"rs_{serial}",
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": reply.reasoning}],
                "encrypted_content": f"opaque-reasoning-{serial}",
            }
        )
    if reply.text is not None:
        items.append(
            {
                "id": f"msg_{serial}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
            }
        )
    for index, call in enumerate(reply.calls):
        items.append(
            {
                "id": f"fc_{serial}_{index}",
                "type": "function_call",
                "status": "completed",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": arguments_json(call),
            }
        )
    return items


def responses_body(
    reply: Reply, body: Mapping[str, Any], serial: int, *, status: str = "completed"
) -> dict[str, Any]:
    prompt = usage_tokens(body)
    done = status == "completed"
    return {
        "id": f"resp_{serial}",
        "object": "response",
        "created_at": 1,
        "status": status,
        "model": body.get("model") or MODEL,
        "output": responses_items(reply, serial) if done else [],
        "instructions": body.get("instructions"),
        "tools": list(body.get("tools") or []),
        "tool_choice": body.get("tool_choice", "auto"),
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "store": body.get("store", True),
        "error": None,
        "incomplete_details": None,
        "metadata": {},
        "temperature": 1.0,
        "top_p": 1.0,
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": 10,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + 10,
        }
        if done
        else None,
    }


def responses_events(
    reply: Reply, body: Mapping[str, Any], serial: int
) -> list[tuple[str, dict[str, Any]]]:
    """The event sequence of a streamed response. Codex CLI takes its items from
    ``response.output_item.done`` and needs ``response.completed``; the Agents SDK reads only
    ``response.completed``; deltas are what a client shows while the reply streams."""
    events: list[tuple[str, dict[str, Any]]] = []

    def emit(kind: str, **fields: Any) -> None:
        events.append((kind, {"type": kind, "sequence_number": len(events), **fields}))

    start = responses_body(reply, body, serial, status="in_progress")
    emit("response.created", response=start)
    emit("response.in_progress", response=start)
    for index, item in enumerate(responses_items(reply, serial)):
        item_id = item["id"]
        if item["type"] == "reasoning":
            emit("response.output_item.added", output_index=index, item={**item, "summary": []})
            text = item["summary"][0]["text"]
            part = {"type": "summary_text", "text": ""}
            where = {"item_id": item_id, "output_index": index, "summary_index": 0}
            emit("response.reasoning_summary_part.added", **where, part=part)
            emit("response.reasoning_summary_text.delta", **where, delta=text)
            emit("response.reasoning_summary_text.done", **where, text=text)
            emit("response.reasoning_summary_part.done", **where, part={**part, "text": text})
        elif item["type"] == "message":
            opening = {**item, "status": "in_progress", "content": []}
            emit("response.output_item.added", output_index=index, item=opening)
            text = item["content"][0]["text"]
            part = {"type": "output_text", "text": "", "annotations": []}
            where = {"item_id": item_id, "output_index": index, "content_index": 0}
            emit("response.content_part.added", **where, part=part)
            for i in range(0, len(text), 16):
                emit("response.output_text.delta", **where, delta=text[i : i + 16], logprobs=[])
            emit("response.output_text.done", **where, text=text, logprobs=[])
            emit("response.content_part.done", **where, part={**part, "text": text})
        else:
            opening = {**item, "status": "in_progress", "arguments": ""}
            emit("response.output_item.added", output_index=index, item=opening)
            args = item["arguments"]
            where = {"item_id": item_id, "output_index": index}
            for i in range(0, len(args), 16):
                emit("response.function_call_arguments.delta", **where, delta=args[i : i + 16])
            emit(
                "response.function_call_arguments.done", **where, arguments=args, name=item["name"]
            )
        emit("response.output_item.done", output_index=index, item=item)
    emit("response.completed", response=responses_body(reply, body, serial))
    return events


# ----------------------------------------------------------------------------- Anthropic Messages


def read_messages(body: Mapping[str, Any]) -> Turn:
    system = [text_of(body.get("system"))] if body.get("system") else []
    items: list[Item] = []
    for message in body.get("messages") or []:
        role, content = message.get("role"), message.get("content")
        if role == "system":  # Claude Code sends its environment as a system message in turn
            system.append(text_of(content))
            continue
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        for block in blocks:
            kind = block.get("type")
            if kind == "text":
                item: Item = (UserText if role == "user" else AssistantText)(block.get("text", ""))
                items.append(item)
            elif kind == "tool_use":
                items.append(
                    ToolCall(block["id"], block.get("name", ""), dict(block.get("input") or {}))
                )
            elif kind == "tool_result":
                items.append(
                    ToolResult(block.get("tool_use_id", ""), text_of(block.get("content")))
                )
    tools = tuple(str(tool.get("name") or tool.get("type")) for tool in body.get("tools") or [])
    return Turn("\n".join(system), tuple(items), tools)


def messages_blocks(reply: Reply, serial: int) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if reply.reasoning:
        blocks.append(
            {"type": "thinking", "thinking": reply.reasoning, "signature": f"sig-{serial}"}
        )
    if reply.text is not None:
        blocks.append({"type": "text", "text": reply.text})
    blocks += [
        {"type": "tool_use", "id": call.call_id, "name": call.name, "input": dict(call.arguments)}
        for call in reply.calls
    ]
    return blocks


def messages_body(reply: Reply, body: Mapping[str, Any], serial: int) -> dict[str, Any]:
    return {
        "id": f"msg_{serial}",
        "type": "message",
        "role": "assistant",
        "model": body.get("model") or MODEL,
        "content": messages_blocks(reply, serial),
        "stop_reason": "tool_use" if reply.calls else "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": usage_tokens(body),
            "output_tokens": 10,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def messages_events(
    reply: Reply, body: Mapping[str, Any], serial: int
) -> list[tuple[str, dict[str, Any]]]:
    """The event sequence of a streamed message. Claude Code needs ``message_start`` and each
    block's ``content_block_start``/``_stop`` (without them it asks again, unstreamed)."""
    whole = messages_body(reply, body, serial)
    start = {
        **whole,
        "content": [],
        "stop_reason": None,
        "usage": {**whole["usage"], "output_tokens": 1},
    }
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start})
    ]
    for index, block in enumerate(whole["content"]):
        kind = block["type"]
        if kind == "text":
            opening: dict[str, Any] = {"type": "text", "text": ""}
            text = block["text"]
            deltas = [
                {"type": "text_delta", "text": text[i : i + 16]} for i in range(0, len(text), 16)
            ]
        elif kind == "thinking":
            opening = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": block["thinking"]},
                {"type": "signature_delta", "signature": block["signature"]},
            ]
        else:
            opening = {**block, "input": {}}
            raw = json.dumps(block["input"])
            deltas = [
                {"type": "input_json_delta", "partial_json": raw[i : i + 16]}
                for i in range(0, len(raw), 16)
            ]
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": opening},
            )
        )
        if index == 0:
            events.append(("ping", {"type": "ping"}))
        events += [
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
            for delta in deltas
        ]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": whole["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": whole["usage"]["output_tokens"]},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events
