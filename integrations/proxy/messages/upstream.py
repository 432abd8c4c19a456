"""A Messages upstream: the window as Anthropic messages with the client's own blocks where they
are unchanged and the proxy's own cache breakpoints, the reply and its stream read into the chat
completion the keeper works on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import BaseMessage, SystemMessage

from keeper_middleware.integrations.proxy.conversation.form import ChatRequest
from keeper_middleware.integrations.proxy.conversation.native import (
    Render,
    client_tools,
    merge_call_kwargs,
)
from keeper_middleware.integrations.proxy.conversation.native_events import NativeAssembler
from keeper_middleware.integrations.proxy.conversation.wire import WireContext
from keeper_middleware.integrations.proxy.messages.replies import chat_from_message
from keeper_middleware.integrations.proxy.messages.requests import (
    MESSAGES_SEARCH_TOOL,
    merged,
    messages_tools,
    render_messages,
    without_cache_marks,
)
from keeper_middleware.integrations.proxy.messages.upstream_events import MessagesAssembler
from keeper_middleware.messages.facts import text_of

__all__ = ["ANTHROPIC_VERSION", "MessagesApi"]

ANTHROPIC_VERSION = "2023-06-01"


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
        return client_tools(request, "messages", messages_tools)

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
        merge_call_kwargs(body, kwargs)
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
