"""Serve any LangChain chat model as a minimal OpenAI-compatible endpoint on 127.0.0.1.

The proxy way of running the marathon needs its model behind HTTP, as a real deployment has it.
With a real model that is the user's server; with the scripted agent it is this: chat completions
(JSON or SSE), tools passed to ``bind_tools``, usage from a character estimate (the model reports
none). Requests are answered one at a time, in order, as a single-slot server would.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, convert_to_messages
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


def _messages(raw: list[dict[str, Any]]) -> list[BaseMessage]:
    cleaned = [{**m, "content": m.get("content") or ""} for m in raw]
    return convert_to_messages(cleaned)


def _tool_calls(reply: AIMessage) -> list[dict[str, Any]]:
    return [
        {
            "id": call.get("id") or f"call_{uuid.uuid4().hex[:12]}",
            "type": "function",
            "function": {"name": call["name"], "arguments": json.dumps(call["args"])},
        }
        for call in reply.tool_calls
    ]


def _usage(messages: list[dict[str, Any]], reply: AIMessage) -> dict[str, int]:
    prompt = sum(len(json.dumps(m, ensure_ascii=False)) for m in messages) // 4 + 1
    completion = len(str(reply.content)) // 4 + 8 * len(reply.tool_calls) + 1
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def create_model_app(model: BaseChatModel, name: str) -> Starlette:
    lock = threading.Lock()

    def answer(body: dict[str, Any]) -> AIMessage:
        bound: Any = model.bind_tools(body["tools"]) if body.get("tools") else model
        with lock:
            reply = bound.invoke(_messages(body["messages"]))
        assert isinstance(reply, AIMessage)
        return reply

    async def completions(request: Request) -> Response:
        body = await request.json()
        reply = answer(body)
        usage = _usage(body["messages"], reply)
        calls = _tool_calls(reply)
        message: dict[str, Any] = {"role": "assistant", "content": str(reply.content) or None}
        if calls:
            message["tool_calls"] = calls
        finish = "tool_calls" if calls else "stop"
        ident, created = f"chatcmpl-{uuid.uuid4().hex[:16]}", int(time.time())
        if not body.get("stream"):
            return JSONResponse(
                {
                    "id": ident,
                    "object": "chat.completion",
                    "created": created,
                    "model": name,
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    "usage": usage,
                }
            )

        def events() -> Iterator[str]:
            head = {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": created,
                "model": name,
            }
            delta: dict[str, Any] = {"role": "assistant", "content": message["content"] or ""}
            if calls:
                delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(calls)]
            yield f"data: {json.dumps({**head, 'choices': [{'index': 0, 'delta': delta, 'finish_reason': None}]})}\n\n"
            done = {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
            yield f"data: {json.dumps(done)}\n\n"
            yield f"data: {json.dumps({**head, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def models(_request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": name, "object": "model"}]})

    return Starlette(
        routes=[
            Route("/v1/chat/completions", completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
        ]
    )


@contextmanager
def serve_model(model: BaseChatModel, name: str) -> Iterator[str]:
    """Serve ``model`` on a free loopback port; yields its ``/v1`` base URL."""
    from keeper_middleware.integrations.proxy.cli import serve_in_thread

    with serve_in_thread(create_model_app(model, name)) as url:
        yield url
