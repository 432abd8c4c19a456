"""What the Responses and Messages APIs share on their way into the conversation form and back
(pure): a tool as a chat function, an assistant turn and a tool result as messages, the request
put together, an upstream reply as the chat completion the keeper reads, and the parts of a
window message kept from the items it came in as.

Each API's own module reads its items or blocks into the pieces these take (texts, calls,
reasoning) and writes them back in its own shape; what is the same for both lives here once.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage

from keeper_middleware.integrations.proxy.conversation.chat_messages import message_from_openai
from keeper_middleware.integrations.proxy.conversation.digests import digest_of
from keeper_middleware.integrations.proxy.conversation.form import ChatRequest, RequestError
from keeper_middleware.integrations.proxy.conversation.wire import (
    WIRE_KEY,
    WireContext,
    content_as_text,
)
from keeper_middleware.messages.facts import text_of

Render = Callable[[BaseMessage], dict[str, Any]]
"""One window message as an upstream's API reads it (converted once per message)."""

__all__ = [
    "Render",
    "assistant_message",
    "assistant_parts",
    "chat_call",
    "chat_function",
    "client_tools",
    "completion_of",
    "image_source",
    "image_url",
    "merge_call_kwargs",
    "native_request",
    "own_items",
    "tool_result",
]


def chat_function(name: str, parameters: Any, description: object = None) -> dict[str, Any]:
    """A client's tool as the chat function the keeper counts and a chat upstream is offered."""
    function: dict[str, Any] = {"name": name, "parameters": parameters}
    if description:
        function["description"] = str(description)
    return {"type": "function", "function": function}


def chat_call(call_id: object, name: str, arguments: object) -> dict[str, Any]:
    """A tool call in the chat form; ``arguments`` as given, or JSON of what was given."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    return {
        "id": str(call_id or ""),
        "type": "function",
        "function": {"name": name, "arguments": text},
    }


def assistant_message(
    texts: Iterable[str], calls: Sequence[dict[str, Any]], reasoning: Sequence[str], index: int
) -> BaseMessage:
    """An assistant turn read from its parts: the texts joined, the calls (chat form), and the
    reasoning it carried (``reasoning_content``, as a chat upstream sends it)."""
    chat: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        chat["tool_calls"] = list(calls)
    message = message_from_openai(chat, index)
    if any(reasoning):
        kwargs = {**message.additional_kwargs, "reasoning_content": "\n".join(reasoning)}
        message = message.model_copy(update={"additional_kwargs": kwargs})
    return message


def tool_result(call_id: str, output: Any, index: int) -> BaseMessage:
    """A tool's result: its text, or the text of its content parts."""
    text = output if isinstance(output, str) else content_as_text(output or [])
    return message_from_openai({"role": "tool", "tool_call_id": call_id, "content": text}, index)


def native_request(
    body: Mapping[str, Any],
    *,
    context: WireContext,
    system_texts: Sequence[str],
    messages: list[BaseMessage],
    tools: tuple[dict[str, Any], ...],
    own_fields: Sequence[str],
) -> ChatRequest:
    """The request in the conversation form, once its API has read the messages: the settings
    it does not read itself pass on as ``params``.

    Raises:
        RequestError: ``stream`` is not a boolean.
    """
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError("'stream' must be true or false.", param="stream")
    texts = [t for t in system_texts if t]
    return ChatRequest(
        system_prompt="\n\n".join(texts) if texts else None,
        messages=messages,
        tools=tools,
        stream=stream,
        include_usage=True,
        params={k: v for k, v in body.items() if k not in own_fields},
        api=context.api,
        context=context,
        given_digests=tuple(digest_of(m) for m in messages),
    )


def completion_of(
    message: AIMessage,
    *,
    api: str,
    items: list[Any],
    reply: Mapping[str, Any],
    reason: Callable[[bool], str],
    usage: dict[str, Any] | None,
    defaults: tuple[str, int],
) -> dict[str, Any]:
    """An upstream's native reply, read into ``message``, as the chat completion the keeper
    reads; its items ride along (``message[WIRE_KEY]``) for the window copy and for a client of
    the same API. ``reason`` gives the finish reason from whether the reply calls tools,
    ``defaults`` the id and creation time when the reply has none."""
    chat: dict[str, Any] = {"role": "assistant", "content": text_of(message) or None}
    calls = [
        chat_call(c["id"], c["name"], json.dumps(c["args"], ensure_ascii=False))
        for c in message.tool_calls
    ] + [
        chat_call(c["id"], c["name"] or "", c["args"] if isinstance(c["args"], str) else "")
        for c in message.invalid_tool_calls
    ]
    if calls:
        chat["tool_calls"] = calls
    reasoning = message.additional_kwargs.get("reasoning_content")
    if reasoning:
        chat["reasoning_content"] = reasoning
    chat[WIRE_KEY] = {"api": api, "items": items, "reply": dict(reply)}
    completion: dict[str, Any] = {
        "id": reply.get("id") or defaults[0],
        "object": "chat.completion",
        "created": defaults[1],
        "model": reply.get("model") or "",
        "choices": [
            {"index": 0, "message": chat, "finish_reason": reason(bool(calls)), "logprobs": None}
        ],
    }
    if usage is not None:
        completion["usage"] = usage
    return completion


def own_items(message: BaseMessage, api: str) -> list[Mapping[str, Any]]:
    """The items (or blocks) ``message`` came in as through ``api``, changed or not: what a
    rendering of the changed message keeps (reasoning, the calls it still holds)."""
    wire = message.additional_kwargs.get(WIRE_KEY)
    if isinstance(wire, Mapping) and wire.get("api") == api:
        return [i for i in wire.get("items") or [] if isinstance(i, Mapping)]
    return []


def assistant_parts(
    message: AIMessage,
    template: Sequence[Mapping[str, Any]],
    *,
    kept: Sequence[str],
    calls: Sequence[str],
    id_key: str,
    text: Callable[[str], dict[str, Any]],
    call: Callable[[str | None, str | None, dict[str, Any] | str], dict[str, Any]],
) -> list[Any]:
    """An assistant message written back in an API's shape: the parts of kinds ``kept`` it came
    with (reasoning), its text (``text``), and each call as it came (its part of a kind in
    ``calls``, found by ``id_key``) or else made anew (``call``: id, name, and the arguments, a
    mapping or, for a call that did not parse, the raw text)."""
    parts: list[Any] = [p for p in template if p.get("type") in kept]
    said = text_of(message)
    if said:
        parts.append(text(said))
    by_id = {p.get(id_key): p for p in template if p.get("type") in calls}
    for valid in message.tool_calls:
        parts.append(by_id.get(valid["id"]) or call(valid["id"], valid["name"], valid["args"]))
    for bad in message.invalid_tool_calls:
        raw = bad["args"] if isinstance(bad["args"], str) else ""
        parts.append(by_id.get(bad["id"]) or call(bad["id"], bad["name"], raw))
    return parts


def image_url(block: Mapping[str, Any]) -> str | None:
    """A Messages image block's source as the URL a Responses ``input_image`` takes."""
    source = block.get("source")
    if not isinstance(source, Mapping):
        return None
    if source.get("type") == "base64":
        return f"data:{source.get('media_type') or 'image/png'};base64,{source.get('data') or ''}"
    url = source.get("url")
    return url if isinstance(url, str) else None


def image_source(url: str) -> dict[str, Any]:
    """A Responses image URL (a ``data:`` URL or a link) as a Messages image block."""
    if url.startswith("data:"):
        head, _, data = url.partition(",")
        media = head[5:].split(";")[0] or "image/png"
        return {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def merge_call_kwargs(body: dict[str, Any], call_kwargs: Mapping[str, Any]) -> None:
    """The keeper's call kwargs (thinking, sampling) in the shape a ``ChatOpenAI`` call takes
    them: ``extra_body`` merged at the top level."""
    for key, value in call_kwargs.items():
        if key == "extra_body" and isinstance(value, Mapping):
            body.update(value)
        else:
            body[key] = value


def client_tools(
    request: ChatRequest,
    api: str,
    from_chat: Callable[[Sequence[Mapping[str, Any]]], list[dict[str, Any]]],
) -> tuple[dict[str, Any], ...]:
    """The client's tools for an upstream of ``api``: as the client sent them when it speaks
    that API (built-in tools included), else its chat functions in that API's format."""
    if request.api == api and request.context is not None:
        return tuple(dict(t) for t in request.context.tools)
    return tuple(from_chat(request.tools))
