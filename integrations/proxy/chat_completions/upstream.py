"""A Chat Completions upstream (local servers: llama.cpp, vLLM): the window rendered as chat
messages, a user message read through another API keeping its images, the reply read as it is
(its stream is read by the chat stream loop, :mod:`.streams`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import BaseMessage

from keeper_middleware.integrations.proxy.conversation.chat_messages import (
    message_to_openai,
    upstream_body,
)
from keeper_middleware.integrations.proxy.conversation.form import SEARCH_TOOL_SCHEMA, ChatRequest
from keeper_middleware.integrations.proxy.conversation.native import Render, image_url
from keeper_middleware.integrations.proxy.conversation.native_events import NativeAssembler
from keeper_middleware.integrations.proxy.conversation.wire import WireContext, foreign_items

__all__ = ["ChatApi"]


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
        elif kind == "image" and (url := image_url(block)) is not None:
            parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts
