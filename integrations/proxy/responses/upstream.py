"""A Responses upstream: the window as ``input`` items with the client's own items where they are
unchanged, ``store: false`` and encrypted reasoning asked back, the reply and its stream read
into the chat completion the keeper works on."""

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
from keeper_middleware.integrations.proxy.responses.replies import chat_from_response
from keeper_middleware.integrations.proxy.responses.requests import (
    RESPONSES_SEARCH_TOOL,
    render_responses,
    responses_tools,
)
from keeper_middleware.integrations.proxy.responses.upstream_events import ResponsesAssembler
from keeper_middleware.messages.facts import text_of

__all__ = ["ResponsesApi"]


class ResponsesApi:
    """OpenAI Responses. The upstream never keeps state for the proxy: every call carries the
    whole window, ``store: false``, and asks for encrypted reasoning back so reasoning items
    can be sent again; ``previous_response_id`` is never forwarded."""

    name: str = "responses"
    path: str = "/responses"
    search_tool: Mapping[str, Any] = RESPONSES_SEARCH_TOOL
    note_fields: tuple[str, ...] = ("model", "reasoning")

    def tools(self, request: ChatRequest) -> tuple[dict[str, Any], ...]:
        return client_tools(request, "responses", responses_tools)

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
        merge_call_kwargs(body, kwargs)
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
