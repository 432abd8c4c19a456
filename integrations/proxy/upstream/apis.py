"""The API the upstream speaks: Chat Completions (local servers: llama.cpp, vLLM), Responses or
Anthropic Messages (``keeper-proxy --upstream-api``).

One :class:`UpstreamApi` per API says how the keeper's window becomes that API's request
(system part, messages, tools with the archive search in that API's own tool format, settings),
how its reply (plain or streamed) is read back into the chat completion the keeper works on,
and which headers it needs. The keeper engine itself is the same for all three.

When the client speaks the upstream's API, its tools, settings and items go as they came
(:mod:`.wire`); otherwise they are translated through the chat form (:mod:`.api_params`),
and what has no counterpart stays behind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from langchain_core.messages import BaseMessage, SystemMessage

from keeper_middleware.errors import ConfigurationError
from keeper_middleware.integrations.proxy.conversation.form import (
    SEARCH_TOOL_SCHEMA,
    ChatRequest,
    message_to_openai,
    upstream_body,
)
from keeper_middleware.integrations.proxy.conversation.params import translate_params
from keeper_middleware.integrations.proxy.conversation.wire import (
    API_NAMES,
    WireContext,
    foreign_items,
)
from keeper_middleware.integrations.proxy.messages.requests import (
    MESSAGES_SEARCH_TOOL,
    chat_from_message,
    merged,
    messages_tools,
    render_messages,
    without_cache_marks,
)
from keeper_middleware.integrations.proxy.responses.replies import chat_from_response
from keeper_middleware.integrations.proxy.responses.requests import (
    RESPONSES_SEARCH_TOOL,
    render_responses,
    responses_tools,
)
from keeper_middleware.integrations.proxy.upstream.native_streams import (
    MessagesAssembler,
    NativeAssembler,
    ResponsesAssembler,
)
from keeper_middleware.messages.facts import text_of

__all__ = ["UPSTREAM_APIS", "ChatApi", "MessagesApi", "ResponsesApi", "UpstreamApi", "upstream_api"]

Render = Callable[[BaseMessage], dict[str, Any]]
ANTHROPIC_VERSION = "2023-06-01"


class UpstreamApi(Protocol):
    """How the keeper talks to an upstream of one API."""

    name: str
    path: str
    """Appended to the upstream's base URL (``/chat/completions``, ``/responses``, ...)."""
    search_tool: Mapping[str, Any]
    """``search_archive`` in this API's tool format."""
    note_fields: tuple[str, ...]
    """The client's settings a note call carries (what names the model and shapes the prompt
    prefix): an allowlist, so a field no one has thought of never reaches a note call."""

    def tools(self, request: ChatRequest) -> tuple[dict[str, Any], ...]:
        """The client's tools in this API's format (without the archive search)."""
        ...

    def render(self, message: BaseMessage) -> dict[str, Any]:
        """One window message as this API reads it (converted once per message)."""
        ...

    def body(
        self,
        messages: Sequence[BaseMessage],
        tools: Sequence[Mapping[str, Any]],
        params: Mapping[str, Any],
        call_kwargs: Mapping[str, Any],
        render: Render,
        context: WireContext | None,
    ) -> dict[str, Any]:
        """One non-streaming upstream request for the rendered window."""
        ...

    def read(self, reply: Mapping[str, Any]) -> dict[str, Any]:
        """A whole reply as a chat completion (a ``ValueError`` if it cannot be read)."""
        ...

    def assembler(self) -> NativeAssembler: ...


def _merge_kwargs(body: dict[str, Any], call_kwargs: Mapping[str, Any]) -> None:
    """The keeper's call kwargs (thinking, sampling) in the shape a ``ChatOpenAI`` call takes
    them: ``extra_body`` merged at the top level."""
    for key, value in call_kwargs.items():
        if key == "extra_body" and isinstance(value, Mapping):
            body.update(value)
        else:
            body[key] = value


class ChatApi:
    """OpenAI Chat Completions: the neutral spelling, and what local servers serve."""

    name: str = "chat"
    path: str = "/chat/completions"
    search_tool: Mapping[str, Any] = SEARCH_TOOL_SCHEMA
    note_fields: tuple[str, ...] = ("model",)

    def tools(self, request: ChatRequest) -> tuple[dict[str, Any], ...]:
        return tuple(request.tools)

    def render(self, message: BaseMessage) -> dict[str, Any]:
        """``message_to_openai``; a user message read through another API unchanged since
        keeps its images (``image_url`` parts)."""
        rendered = message_to_openai(message)
        if rendered.get("role") == "user" and (found := foreign_items(message)) is not None:
            parts = _chat_parts(*found)
            if any(p["type"] == "image_url" for p in parts):
                rendered = {**rendered, "content": parts}
        return rendered

    def body(
        self,
        messages: Sequence[BaseMessage],
        tools: Sequence[Mapping[str, Any]],
        params: Mapping[str, Any],
        call_kwargs: Mapping[str, Any],
        render: Render,
        context: WireContext | None,
    ) -> dict[str, Any]:
        return upstream_body(messages, tools, params, call_kwargs, render)

    def read(self, reply: Mapping[str, Any]) -> dict[str, Any]:
        return dict(reply)

    def assembler(self) -> NativeAssembler:
        raise AssertionError("chat streams are read by the chat stream loop")


def _chat_parts(api: str, items: Sequence[Any]) -> list[dict[str, Any]]:
    """A user message's text and images as chat content parts."""
    parts: list[dict[str, Any]] = []
    blocks: list[Any] = []
    if api == "responses":
        for item in items:
            content = item.get("content") if isinstance(item, Mapping) else None
            blocks += content if isinstance(content, list) else []
    elif api == "messages":
        blocks = list(items)
    for block in blocks:
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind in ("input_text", "text") and block.get("text"):
            parts.append({"type": "text", "text": str(block["text"])})
        elif kind == "input_image" and isinstance(block.get("image_url"), str):
            image = {"url": block["image_url"], "detail": block.get("detail") or "auto"}
            parts.append({"type": "image_url", "image_url": image})
        elif kind == "image" and isinstance(block.get("source"), Mapping):
            source = block["source"]
            url = source.get("url")
            if source.get("type") == "base64":
                url = f"data:{source.get('media_type') or 'image/png'};base64,{source.get('data')}"
            if isinstance(url, str):
                parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts


class ResponsesApi:
    """OpenAI Responses. The upstream never keeps state for the proxy: every call carries the
    whole window, ``store: false``, and asks for encrypted reasoning back so reasoning items
    can be sent again; ``previous_response_id`` is never forwarded."""

    name: str = "responses"
    path: str = "/responses"
    search_tool: Mapping[str, Any] = RESPONSES_SEARCH_TOOL
    note_fields: tuple[str, ...] = ("model", "reasoning")

    def tools(self, request: ChatRequest) -> tuple[dict[str, Any], ...]:
        if request.api == "responses" and request.context is not None:
            return tuple(dict(t) for t in request.context.tools)
        return tuple(responses_tools(request.tools))

    def render(self, message: BaseMessage) -> dict[str, Any]:
        return render_responses(message)

    def body(
        self,
        messages: Sequence[BaseMessage],
        tools: Sequence[Mapping[str, Any]],
        params: Mapping[str, Any],
        call_kwargs: Mapping[str, Any],
        render: Render,
        context: WireContext | None,
    ) -> dict[str, Any]:
        body = {k: v for k, v in params.items() if k not in _RESPONSES_NOT_SENT}
        kwargs = dict(call_kwargs)
        effort = kwargs.pop("reasoning_effort", None)
        _merge_kwargs(body, kwargs)
        if effort is not None:
            body["reasoning"] = {**(body.get("reasoning") or {}), "effort": effort}
        items: list[Any] = []
        rest = list(messages)
        if rest and isinstance(rest[0], SystemMessage):
            system = rest.pop(0)
            if context is not None and context.api == "responses":
                if context.instructions is not None:
                    body["instructions"] = context.instructions
                items += context.system_items
            else:
                body["instructions"] = text_of(system)
        for message in rest:
            items += render(message)["items"]
        body["input"] = items
        if tools:
            body["tools"] = [dict(t) for t in tools]
        body["store"] = False
        include = [i for i in body.get("include") or [] if i != "reasoning.encrypted_content"]
        body["include"] = [*include, "reasoning.encrypted_content"]
        body["stream"] = False
        return body

    def read(self, reply: Mapping[str, Any]) -> dict[str, Any]:
        return chat_from_response(reply)

    def assembler(self) -> NativeAssembler:
        return ResponsesAssembler()


_RESPONSES_NOT_SENT = frozenset(
    {"input", "tools", "stream", "stream_options", "previous_response_id", "store", "background",
     "conversation", "prompt", "instructions"}
)  # fmt: skip


class MessagesApi:
    """Anthropic Messages. ``max_tokens`` is required (the reply reserve when the client set
    none); the proxy places its own cache breakpoints: the last tool, the end of the system
    part and the last block of the conversation (the client's would point into history the
    keeper has moved)."""

    name: str = "messages"
    path: str = "/messages"
    search_tool: Mapping[str, Any] = MESSAGES_SEARCH_TOOL
    note_fields: tuple[str, ...] = ("model", "thinking")

    def __init__(self, reserve: int = 4096) -> None:
        self.reserve = reserve

    def tools(self, request: ChatRequest) -> tuple[dict[str, Any], ...]:
        if request.api == "messages" and request.context is not None:
            return tuple(dict(t) for t in request.context.tools)
        return tuple(messages_tools(request.tools))

    def render(self, message: BaseMessage) -> dict[str, Any]:
        return render_messages(message)

    def body(
        self,
        messages: Sequence[BaseMessage],
        tools: Sequence[Mapping[str, Any]],
        params: Mapping[str, Any],
        call_kwargs: Mapping[str, Any],
        render: Render,
        context: WireContext | None,
    ) -> dict[str, Any]:
        body = {k: v for k, v in params.items() if k not in ("messages", "system", "tools")}
        kwargs = dict(call_kwargs)
        kwargs.pop("reasoning_effort", None)  # Messages has no such field; thinking is a param
        thinking = body.get("thinking")
        if isinstance(thinking, Mapping) and thinking.get("type") in ("enabled", "adaptive"):
            kwargs.pop("temperature", None)  # only the default temperature goes with thinking
        _merge_kwargs(body, kwargs)
        body.setdefault("max_tokens", self.reserve)
        rest = list(messages)
        system: list[Any] = []
        if rest and isinstance(rest[0], SystemMessage):
            first = rest.pop(0)
            if context is not None and context.api == "messages":
                system = [dict(b) for b in context.system_items]
            elif text_of(first):
                system = [{"type": "text", "text": text_of(first)}]
        conversation = merged([render(m) for m in rest])
        if system:
            system[-1] = {**system[-1], "cache_control": {"type": "ephemeral"}}
            body["system"] = system
        if tools:
            body["tools"] = [without_cache_marks(t) for t in tools]
            body["tools"][-1] = {**body["tools"][-1], "cache_control": {"type": "ephemeral"}}
        if conversation and isinstance(conversation[-1]["content"], list):
            last = conversation[-1]
            blocks = list(last["content"])
            if blocks and blocks[-1].get("type") not in ("thinking", "redacted_thinking"):
                blocks[-1] = {**blocks[-1], "cache_control": {"type": "ephemeral"}}
                conversation[-1] = {**last, "content": blocks}
        body["messages"] = conversation
        body["stream"] = False
        return body

    def read(self, reply: Mapping[str, Any]) -> dict[str, Any]:
        return chat_from_message(reply)

    def assembler(self) -> NativeAssembler:
        return MessagesAssembler()


UPSTREAM_APIS = API_NAMES


def upstream_api(name: str, *, reserve: int = 4096) -> UpstreamApi:
    """The API named ``chat``, ``responses`` or ``messages``."""
    if name == "chat":
        return ChatApi()
    if name == "responses":
        return ResponsesApi()
    if name == "messages":
        return MessagesApi(reserve)
    raise ConfigurationError(
        f"upstream_api={name!r} is not an API the proxy speaks; use one of {', '.join(API_NAMES)}"
    )


def shaped_params(request: ChatRequest, api: UpstreamApi) -> dict[str, Any]:
    """The client's settings as the upstream's API takes them."""
    return translate_params(request.params, request.api, api.name)
