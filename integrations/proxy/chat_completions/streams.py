"""Server-sent events: reading the upstream's token stream and writing the agent's (pure).

When the agent asks for a stream, the proxy asks the upstream for one too and passes the text on
as it arrives, with its log probabilities, under the upstream's own envelope (id, model,
created, system fingerprint: the first chunk's, for the whole stream). It stops passing on at the
first tool call delta: from there the reply may be an archive search the agent must never see,
so the rest is assembled and decided once complete.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

import orjson

from keeper_middleware.integrations.proxy.conversation.pieces import StreamPiece

__all__ = [
    "ENVELOPE_FIELDS",
    "StreamAssembler",
    "StreamPiece",
    "chunk_envelope",
    "sse_event",
    "sse_finish",
    "sse_start",
]

_TEXT_FIELDS = ("content", "reasoning_content", "reasoning")
ENVELOPE_FIELDS = ("id", "created", "model", "system_fingerprint", "service_tier")
"""What a chunk carries about the whole stream; the first chunk's values hold for all of it."""


class StreamAssembler:
    """Collects one upstream stream into the completion a non-streaming call would have given,
    and says which deltas can go to the agent at once."""

    def __init__(self) -> None:
        self.envelope: dict[str, Any] = {}
        self.text: dict[str, list[str]] = {}
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.timings: dict[str, Any] | None = None
        """llama-server's prompt and cache counts (its last chunk carries them)."""
        self.forwarded: dict[str, str] = {}
        """Text already passed to the agent, per field."""
        self.logprobs: dict[str, list[Any]] = {}
        """Every chunk's log probabilities, per list (``content``, ``refusal``)."""
        self.logprobs_forwarded: dict[str, int] = {}
        """How many of each list were passed to the agent."""
        self.done = False
        """Whether the stream ended with ``data: [DONE]``."""

    @property
    def buffering(self) -> bool:
        return bool(self.calls)

    @property
    def complete(self) -> bool:
        """Whether the stream ended as a whole reply does: with a finish reason or ``[DONE]``.
        A stream that ends with neither was cut short, whatever text it carried."""
        return self.done or self.finish_reason is not None

    def feed(self, chunk: Mapping[str, Any]) -> StreamPiece | None:
        """Take one chunk; returns what to pass on now (None: nothing)."""
        for key in ENVELOPE_FIELDS:
            if chunk.get(key) is not None and key not in self.envelope:
                self.envelope[key] = chunk[key]
        if isinstance(chunk.get("usage"), dict):
            self.usage = dict(chunk["usage"])
        if isinstance(chunk.get("timings"), dict):
            self.timings = dict(chunk["timings"])
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return None
        choice = choices[0]
        if choice.get("finish_reason"):
            self.finish_reason = str(choice["finish_reason"])
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return None
        for call in delta.get("tool_calls") or []:
            if isinstance(call, dict):
                self._add_call(call)
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict):
            for name, entries in logprobs.items():
                if isinstance(entries, list):
                    self.logprobs.setdefault(name, []).extend(entries)
        out: dict[str, str] = {}
        for field in _TEXT_FIELDS:
            piece = delta.get(field)
            if isinstance(piece, str) and piece:
                self.text.setdefault(field, []).append(piece)
                if not self.buffering:
                    out[field] = piece
                    self.forwarded[field] = self.forwarded.get(field, "") + piece
        if not out or self.buffering:
            return None
        if isinstance(logprobs, dict):
            for name in self.logprobs:
                self.logprobs_forwarded[name] = len(self.logprobs[name])
        return StreamPiece(out, logprobs, dict(self.envelope))

    def logprobs_left(self) -> dict[str, list[Any]] | None:
        """The log probabilities not yet passed to the agent (None when there are none)."""
        left = {
            name: entries[self.logprobs_forwarded.get(name, 0) :]
            for name, entries in self.logprobs.items()
        }
        return {k: v for k, v in left.items() if v} or None

    def _add_call(self, call: Mapping[str, Any]) -> None:
        index = call.get("index", len(self.calls))
        slot = self.calls.setdefault(
            int(index) if isinstance(index, int) else len(self.calls),
            {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
        )
        if call.get("id"):
            slot["id"] = call["id"]
        function = call.get("function") or {}
        if function.get("name"):
            slot["function"]["name"] += function["name"]
        if isinstance(function.get("arguments"), str):
            slot["function"]["arguments"] += function["arguments"]

    def completion(self) -> dict[str, Any]:
        """The stream as one chat completion."""
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self.text.get("content", [])),
        }
        for field in ("reasoning_content", "reasoning"):
            if field in self.text:
                message[field] = "".join(self.text[field])
        if self.calls:
            message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
            if not message["content"]:
                message["content"] = None
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "finish_reason": self.finish_reason,
            "logprobs": dict(self.logprobs) if self.logprobs else None,
        }
        body: dict[str, Any] = {"object": "chat.completion", **self.envelope, "choices": [choice]}
        if self.usage is not None:
            body["usage"] = self.usage
        if self.timings is not None:
            body["timings"] = self.timings
        return body


def sse_event(payload: Mapping[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _chunk(
    envelope: Mapping[str, Any],
    delta: Mapping[str, Any],
    reason: str | None,
    logprobs: Any = None,
) -> bytes:
    choice = {"index": 0, "delta": dict(delta), "finish_reason": reason, "logprobs": logprobs}
    return sse_event({**envelope, "choices": [choice]})


def chunk_envelope(data: Mapping[str, Any]) -> dict[str, Any]:
    """The agent's chunks' envelope: the upstream's own (from its first chunk, or from its
    completion when nothing was streamed before the answer was known)."""
    envelope = {
        "id": data.get("id") or "chatcmpl-keeper",
        "object": "chat.completion.chunk",
        "created": data.get("created") or int(time.time()),
        "model": data.get("model") or "",
    }
    for key in ("system_fingerprint", "service_tier"):
        if data.get(key) is not None:
            envelope[key] = data[key]
    return envelope


def sse_start(envelope: Mapping[str, Any]) -> bytes:
    return _chunk(envelope, {"role": "assistant", "content": ""}, None)


def sse_delta(envelope: Mapping[str, Any], piece: StreamPiece) -> bytes:
    return _chunk(envelope, piece.delta, None, piece.logprobs)


def sse_finish(
    envelope: Mapping[str, Any],
    message: Mapping[str, Any],
    finish_reason: str,
    *,
    already: Mapping[str, str],
    usage: Mapping[str, Any] | None,
    logprobs: Any = None,
) -> Iterator[bytes]:
    """What is left of the answer after the text already streamed (``already``, per field):
    the rest of the text (with ``logprobs``, those not streamed yet), the agent's tool calls,
    the finish reason, usage, ``[DONE]``."""
    for field in ("reasoning_content", "reasoning", "content"):
        text = message.get(field)
        if not isinstance(text, str) or not text:
            continue
        sent = already.get(field, "")
        rest = text[len(sent) :] if text.startswith(sent) else text
        if rest:
            yield _chunk(envelope, {field: rest}, None, logprobs if field == "content" else None)
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        delta = {
            "index": index,
            "id": call.get("id"),
            "type": "function",
            "function": {
                "name": function.get("name"),
                "arguments": function.get("arguments") or "",
            },
        }
        yield _chunk(envelope, {"tool_calls": [delta]}, None)
    yield _chunk(envelope, {}, finish_reason)
    if usage is not None:
        yield sse_event({**envelope, "choices": [], "usage": dict(usage)})
    yield b"data: [DONE]\n\n"
