"""The API the upstream speaks: Chat Completions (local servers: llama.cpp, vLLM), Responses or
Anthropic Messages (``keeper-proxy --upstream-api``).

One :class:`UpstreamApi` per API (each in its API's package: ``chat_completions.upstream``,
``responses.upstream``, ``messages.upstream``) says how the keeper's window becomes that API's request
(system part, messages, tools with the archive search in that API's own tool format, settings),
how its reply (plain or streamed) is read back into the chat completion the keeper works on,
and which headers it needs. The keeper engine itself is the same for all three.

When the client speaks the upstream's API, its tools, settings and items go as they came
(``conversation.wire``); otherwise they are translated through the chat form (``conversation.params``),
and what has no counterpart stays behind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from langchain_core.messages import BaseMessage

from keeper_middleware.errors import ConfigurationError
from keeper_middleware.integrations.proxy.chat_completions.upstream import ChatApi
from keeper_middleware.integrations.proxy.conversation.form import ChatRequest
from keeper_middleware.integrations.proxy.conversation.native import Render
from keeper_middleware.integrations.proxy.conversation.native_events import NativeAssembler
from keeper_middleware.integrations.proxy.conversation.params import translate_params
from keeper_middleware.integrations.proxy.conversation.wire import API_NAMES, WireContext
from keeper_middleware.integrations.proxy.messages.upstream import MessagesApi
from keeper_middleware.integrations.proxy.responses.upstream import ResponsesApi

__all__ = [
    "UPSTREAM_APIS",
    "ChatApi",
    "MessagesApi",
    "ResponsesApi",
    "UpstreamApi",
    "shaped_params",
    "upstream_api",
]


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
