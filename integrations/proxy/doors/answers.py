"""An answer going back through the Responses or Messages front door: one JSON body in the
API's shape, or the API's server-sent events (written by ``responses.client_events`` and ``messages.client_events``) while the
upstream streams. An error before the first byte is an ordinary error response; one after it,
the API's error event.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.responses import Response, StreamingResponse

from keeper_middleware.integrations.proxy.chat_completions.streams import StreamPiece
from keeper_middleware.integrations.proxy.conversation.form import WIRE_KEY, ChatRequest
from keeper_middleware.integrations.proxy.conversation.wire import ToolNames, item_id
from keeper_middleware.integrations.proxy.doors.errors import Failure, failure_of
from keeper_middleware.integrations.proxy.messages.client_events import MessagesWriter
from keeper_middleware.integrations.proxy.messages.replies import (
    message_blocks,
    messages_usage,
    stop_reason,
)
from keeper_middleware.integrations.proxy.responses.client_events import ResponsesWriter
from keeper_middleware.integrations.proxy.responses.replies import (
    response_output,
    responses_usage,
)
from keeper_middleware.integrations.proxy.sessions.engine import Answer, KeeperProxy
from keeper_middleware.integrations.proxy.upstream.client import RetryPolicy

__all__ = ["Door", "MessagesDoor", "ResponsesDoor", "stream_answer"]

_RUNNING: set[asyncio.Task[None]] = set()


class Door:
    """One API's answer: as one JSON body, or as the writer's events."""

    def body(self, answer: Answer) -> dict[str, Any]:
        raise NotImplementedError

    def error(self, failure: Failure) -> Response:
        raise NotImplementedError

    def start(self, first: StreamPiece | Answer) -> bytes:
        raise NotImplementedError

    def piece(self, piece: StreamPiece) -> bytes:
        raise NotImplementedError

    def finish(self, answer: Answer) -> bytes:
        raise NotImplementedError

    def failed(self, failure: Failure) -> bytes:
        raise NotImplementedError


def _wire(answer: Answer) -> Mapping[str, Any] | None:
    wire = answer.data["choices"][0]["message"].get(WIRE_KEY)
    return wire if isinstance(wire, Mapping) else None


class ResponsesDoor(Door):
    def __init__(self, parsed: ChatRequest, answer_id: str, stored: bool, created: int) -> None:
        self.parsed, self.id, self.stored, self.created = parsed, answer_id, stored, created
        context = parsed.context
        self.names = context.names if context is not None else ToolNames()
        self.writer: ResponsesWriter | None = None

    def _envelope(self, answer: Answer | None) -> dict[str, Any]:
        params = self.parsed.params
        context = self.parsed.context
        model = (answer.data.get("model") if answer else None) or params.get("model") or ""
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "model": model,
            "instructions": context.instructions if context is not None else None,
            "tools": list(context.tools) if context is not None else [],
            "tool_choice": params.get("tool_choice", "auto"),
            "parallel_tool_calls": params.get("parallel_tool_calls", True),
            "previous_response_id": params.get("previous_response_id"),
            "store": self.stored,
            "metadata": params.get("metadata") or {},
            "temperature": params.get("temperature"),
            "top_p": params.get("top_p"),
            "reasoning": params.get("reasoning"),
            "text": params.get("text") or {"format": {"type": "text"}},
            "error": None,
            "incomplete_details": None,
        }

    def _finished(self, answer: Answer, output: list[Any]) -> dict[str, Any]:
        wire = _wire(answer)
        native = (wire or {}).get("reply", {}).get("usage") if wire else None
        usage = dict(native) if isinstance(native, Mapping) and wire and wire.get("api") == (
            "responses") else responses_usage(answer.data.get("usage"))  # fmt: skip
        body = {**self._envelope(answer), "status": "completed", "output": output, "usage": usage}
        if answer.reason in ("length", "content_filter"):
            reason = "max_output_tokens" if answer.reason == "length" else "content_filter"
            body |= {"status": "incomplete", "incomplete_details": {"reason": reason}}
        return body

    def body(self, answer: Answer) -> dict[str, Any]:
        output = response_output(answer.message, _wire(answer), self.names)
        return self._finished(answer, output)

    def error(self, failure: Failure) -> Response:
        return failure.openai()

    def start(self, first: StreamPiece | Answer) -> bytes:
        envelope = self._envelope(first if isinstance(first, Answer) else None)
        self.writer = ResponsesWriter(skeleton=envelope)
        return self.writer.start()

    def piece(self, piece: StreamPiece) -> bytes:
        assert self.writer is not None
        return self.writer.piece(piece)

    def finish(self, answer: Answer) -> bytes:
        assert self.writer is not None
        items = response_output(answer.message, _wire(answer), self.names)
        events, output = self.writer.finish(items, answer.call)
        return events + self.writer.completed(self._finished(answer, output))

    def failed(self, failure: Failure) -> bytes:
        assert self.writer is not None
        error = {"code": failure.code or failure.kind, "message": failure.message,
                 "param": failure.param}  # fmt: skip
        return self.writer.failed(error)


class MessagesDoor(Door):
    def __init__(self, parsed: ChatRequest, same_api: bool) -> None:
        self.parsed, self.same_api = parsed, same_api
        self.writer: MessagesWriter | None = None
        self.id = item_id("msg")

    def _id(self, answer: Answer | None) -> str:
        wire = _wire(answer) if answer else None
        native = (wire or {}).get("reply", {}).get("id") if wire else None
        return str(native) if native and wire and wire.get("api") == "messages" else self.id

    def body(self, answer: Answer) -> dict[str, Any]:
        wire = _wire(answer)
        return {
            "id": self._id(answer),
            "type": "message",
            "role": "assistant",
            "model": answer.data.get("model") or self.parsed.params.get("model") or "",
            "content": message_blocks(answer.message, wire),
            "stop_reason": stop_reason(answer.reason, wire),
            "stop_sequence": None,
            "usage": messages_usage(answer.data.get("usage"), wire),
        }

    def error(self, failure: Failure) -> Response:
        return failure.anthropic()

    def start(self, first: StreamPiece | Answer) -> bytes:
        model = self.parsed.params.get("model") or ""
        if isinstance(first, StreamPiece):
            model = first.envelope.get("model") or model
            if self.same_api and first.envelope.get("id"):  # the upstream's own message id
                self.id = str(first.envelope["id"])
        elif self.same_api:
            self.id = self._id(first)
        message = {"id": self.id, "type": "message", "role": "assistant", "model": model,
                   "usage": {"input_tokens": 0, "output_tokens": 0}}  # fmt: skip
        self.writer = MessagesWriter(start_message=message, show_thinking=self.same_api)
        return self.writer.start()

    def piece(self, piece: StreamPiece) -> bytes:
        assert self.writer is not None
        return self.writer.piece(piece)

    def finish(self, answer: Answer) -> bytes:
        assert self.writer is not None
        wire = _wire(answer)
        blocks = message_blocks(answer.message, wire)
        usage = messages_usage(answer.data.get("usage"), wire)
        return self.writer.finish(blocks, answer.call, stop_reason(answer.reason, wire), usage)

    def failed(self, failure: Failure) -> bytes:
        return MessagesWriter.failed(failure.anthropic_error())


async def stream_answer(
    proxy: KeeperProxy,
    name: str,
    parsed: ChatRequest,
    auth: str | None,
    headers: dict[str, str],
    door: Door,
    retry: RetryPolicy,
) -> Response:
    """Stream the answer in the door's events: text as the upstream sends it, the rest once the
    reply is known. An error before the first byte is an ordinary error response."""
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    async def forward(piece: StreamPiece) -> None:
        await queue.put(("delta", piece))

    async def run() -> None:
        try:
            await queue.put(("done", await proxy.chat(name, parsed, auth, forward)))
        except Exception as exc:
            await queue.put(("error", exc))

    task = asyncio.create_task(run())
    kind, value = await queue.get()
    if kind == "error":
        return door.error(failure_of(value, name, retry))

    async def events() -> AsyncIterator[bytes]:
        nonlocal kind, value
        yield door.start(value)
        try:
            while True:
                if kind == "delta":
                    yield door.piece(value)
                elif kind == "error":
                    yield door.failed(failure_of(value, name, retry))
                    return
                else:
                    yield door.finish(value)
                    return
                kind, value = await queue.get()
        finally:  # a client that hung up leaves the turn to finish and be kept
            _RUNNING.add(task)
            task.add_done_callback(_RUNNING.discard)

    return StreamingResponse(
        events(), media_type="text/event-stream", headers={**headers, "cache-control": "no-cache"}
    )
