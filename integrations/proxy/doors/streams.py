"""Server-sent events to a Responses or a Messages client, in that API's own event format (pure).

A writer turns what the engine passes on while the upstream streams (text and reasoning, per
upstream call) and the answer once it is known into the event sequence the API's clients read:

- Responses: ``response.created``, ``response.in_progress``, per output item
  ``output_item.added``, its deltas, ``output_item.done``, then ``response.completed`` with the
  whole output. Codex CLI builds its items from ``output_item.done`` and ends the turn on
  ``response.completed``; the Agents SDK reads ``response.completed`` only.
- Messages: ``message_start``, per content block ``content_block_start``, its deltas,
  ``content_block_stop``, then ``message_delta`` (stop reason, usage) and ``message_stop``.
  Claude Code needs the start and stop of every block.

One client response can span several upstream calls (the proxy's archive searches run between
them): items and blocks are numbered across all of them (``output_index``, ``index``,
``sequence_number``), text one call passed on stays in the item it opened, and the answer's
own items follow, so the client sees one coherent response.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from keeper_middleware.integrations.proxy.chat_completions.streams import StreamPiece
from keeper_middleware.integrations.proxy.conversation.wire import item_id
from keeper_middleware.integrations.proxy.responses.replies import output_message

__all__ = ["MessagesWriter", "ResponsesWriter"]


def _sse(kind: str, payload: Mapping[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


@dataclass(slots=True)
class _Live:
    """An item or block opened while the upstream streamed."""

    kind: str
    """``content`` (text) or ``reasoning_content``."""
    id: str
    call: object
    """The upstream call it came from (its envelope id)."""
    index: int
    text: str = ""


@dataclass
class _Writer:
    live: list[_Live] = field(default_factory=list)
    count: int = 0

    def _live_for(self, piece: StreamPiece, kind: str, prefix: str) -> tuple[_Live, bool]:
        """The item this piece's text goes to, and whether it is new."""
        call = piece.call
        if self.live:
            last = self.live[-1]
            if last.kind == kind and last.call == call and (piece.item in (None, last.id)):
                return last, False
        opened = _Live(kind, piece.item or item_id(prefix), call, self.count)
        self.count += 1
        self.live.append(opened)
        return opened, True

    def _match(
        self, final_call: object, kind: str, taken: set[int], item: str | None
    ) -> _Live | None:
        """The live item a final item of ``kind`` continues: the same id, or else the next one
        of its kind that the final upstream call opened."""
        for live in self.live:
            if live.index in taken or live.kind != kind:
                continue
            if (item is not None and live.id == item) or live.call == final_call:
                taken.add(live.index)
                return live
        return None


@dataclass
class ResponsesWriter(_Writer):
    """One streamed Responses answer."""

    skeleton: dict[str, Any] = field(default_factory=dict)
    """The response object as ``response.created`` shows it (status ``in_progress``)."""
    sequence: int = 0
    done: list[dict[str, Any]] = field(default_factory=list)

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return _sse(kind, payload)

    def start(self) -> bytes:
        response = {**self.skeleton, "status": "in_progress", "output": [], "usage": None}
        return self._event("response.created", response=response) + self._event(
            "response.in_progress", response=response
        )

    def piece(self, piece: StreamPiece) -> bytes:
        out = b""
        for field_name, text in piece.delta.items():
            kind = "content" if field_name == "content" else "reasoning_content"
            live, new = self._live_for(piece, kind, "msg" if kind == "content" else "rs")
            if new:
                out += self._open(live)
            live.text += text
            where = {"item_id": live.id, "output_index": live.index}
            if kind == "content":
                out += self._event(
                    "response.output_text.delta", **where, content_index=0, delta=text, logprobs=[]
                )
            else:
                out += self._event(
                    "response.reasoning_summary_text.delta", **where, summary_index=0, delta=text
                )
        return out

    def _open(self, live: _Live) -> bytes:
        where = {"item_id": live.id, "output_index": live.index}
        if live.kind == "content":
            item = {"id": live.id, "type": "message", "role": "assistant",
                    "status": "in_progress", "content": []}  # fmt: skip
            part = {"type": "output_text", "text": "", "annotations": []}
            return self._event(
                "response.output_item.added", output_index=live.index, item=item
            ) + self._event("response.content_part.added", **where, content_index=0, part=part)
        item = {"id": live.id, "type": "reasoning", "summary": []}
        part = {"type": "summary_text", "text": ""}
        return self._event(
            "response.output_item.added", output_index=live.index, item=item
        ) + self._event(
            "response.reasoning_summary_part.added", **where, summary_index=0, part=part
        )

    def finish(
        self, items: Sequence[Mapping[str, Any]], final_call: object
    ) -> tuple[bytes, list[Any]]:
        """The events that close the response with ``items`` (the answer's output), and the
        whole output in the order the client was given it."""
        out = b""
        taken: set[int] = set()
        matched: dict[int, dict[str, Any]] = {}
        rest: list[dict[str, Any]] = []
        for item in items:
            kind = {"message": "content", "reasoning": "reasoning_content"}.get(
                str(item.get("type"))
            )
            live = None if kind is None else self._match(final_call, kind, taken, item.get("id"))
            if live is None:
                rest.append(dict(item))
            else:
                matched[live.index] = {**item, "id": live.id}
        for live in self.live:
            final = matched.get(live.index)
            if final is None:  # text an earlier upstream call passed on: it stays as it was
                final = _closed(live)
            out += self._close(live, final)
        for item in rest:
            out += self._whole(item)
        output = [*(matched.get(live.index) or _closed(live) for live in self.live), *rest]
        return out, output

    def _close(self, live: _Live, item: Mapping[str, Any]) -> bytes:
        where = {"item_id": live.id, "output_index": live.index}
        out = b""
        if live.kind == "content":
            text = _message_text(item)
            if text.startswith(live.text) and len(text) > len(live.text):
                rest = text[len(live.text) :]
                out += self._event(
                    "response.output_text.delta", **where, content_index=0, delta=rest, logprobs=[]
                )
            part = {"type": "output_text", "text": text, "annotations": []}
            out += self._event(
                "response.output_text.done", **where, content_index=0, text=text, logprobs=[]
            )
            out += self._event("response.content_part.done", **where, content_index=0, part=part)
        else:
            text = "\n".join(str(p.get("text") or "") for p in item.get("summary") or [])
            part = {"type": "summary_text", "text": text}
            out += self._event(
                "response.reasoning_summary_text.done", **where, summary_index=0, text=text
            )
            out += self._event(
                "response.reasoning_summary_part.done", **where, summary_index=0, part=part
            )
        return out + self._event("response.output_item.done", output_index=live.index, item=item)

    def _whole(self, item: dict[str, Any]) -> bytes:
        index = self.count
        self.count += 1
        item.setdefault("id", item_id("fc" if "call" in str(item.get("type")) else "item"))
        kind = item.get("type")
        opening = dict(item)
        if kind == "function_call":
            opening |= {"status": "in_progress", "arguments": ""}
        elif kind == "message":
            opening |= {"status": "in_progress", "content": []}
        out = self._event("response.output_item.added", output_index=index, item=opening)
        where = {"item_id": item["id"], "output_index": index}
        if kind == "function_call":
            arguments = str(item.get("arguments") or "")
            out += self._event("response.function_call_arguments.delta", **where, delta=arguments)
            out += self._event(
                "response.function_call_arguments.done", **where, arguments=arguments,
                name=item.get("name"),
            )  # fmt: skip
        elif kind == "message":
            text = _message_text(item)
            part = {"type": "output_text", "text": "", "annotations": []}
            out += self._event("response.content_part.added", **where, content_index=0, part=part)
            out += self._event(
                "response.output_text.delta", **where, content_index=0, delta=text, logprobs=[]
            )
            out += self._event(
                "response.output_text.done", **where, content_index=0, text=text, logprobs=[]
            )
            out += self._event(
                "response.content_part.done", **where, content_index=0, part={**part, "text": text}
            )
        return out + self._event("response.output_item.done", output_index=index, item=item)

    def completed(self, response: Mapping[str, Any]) -> bytes:
        kind = "response.incomplete" if response.get("status") == "incomplete" else None
        return self._event(kind or "response.completed", response=dict(response))

    def failed(self, error: Mapping[str, Any]) -> bytes:
        """An error after the stream began: the ``error`` event, then ``response.failed``."""
        failure = {"code": error.get("code") or error.get("type"), "message": error.get("message")}
        response = {**self.skeleton, "status": "failed", "output": [], "error": failure}
        return self._event(
            "error", code=failure["code"], message=failure["message"], param=error.get("param")
        ) + self._event("response.failed", response=response)


def _message_text(item: Mapping[str, Any]) -> str:
    return "".join(
        str(p.get("text") or "")
        for p in item.get("content") or []
        if isinstance(p, Mapping) and p.get("type") == "output_text"
    )


def _closed(live: _Live) -> dict[str, Any]:
    if live.kind == "content":
        return output_message(live.id, live.text)
    return {
        "id": live.id,
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": live.text}],
    }


@dataclass
class MessagesWriter(_Writer):
    """One streamed Messages answer. Reasoning is shown only as the upstream's own thinking
    blocks (they carry a signature); another API's reasoning is not passed on."""

    start_message: dict[str, Any] = field(default_factory=dict)
    show_thinking: bool = False

    def start(self) -> bytes:
        message = {**self.start_message, "content": [], "stop_reason": None, "stop_sequence": None}
        return _sse("message_start", {"type": "message_start", "message": message}) + _sse(
            "ping", {"type": "ping"}
        )

    def piece(self, piece: StreamPiece) -> bytes:
        out = b""
        for field_name, text in piece.delta.items():
            kind = "content" if field_name == "content" else "reasoning_content"
            if kind != "content" and not self.show_thinking:
                continue
            live, new = self._live_for(piece, kind, "blk")
            if new:
                opening = {"type": "text", "text": ""} if kind == "content" else {
                    "type": "thinking", "thinking": "", "signature": ""}  # fmt: skip
                out += _sse(
                    "content_block_start",
                    {"type": "content_block_start", "index": live.index, "content_block": opening},
                )
            live.text += text
            delta = {"type": "text_delta", "text": text} if kind == "content" else {
                "type": "thinking_delta", "thinking": text}  # fmt: skip
            out += _block_event("content_block_delta", live.index, delta=delta)
        return out

    def finish(
        self,
        blocks: Sequence[Mapping[str, Any]],
        final_call: object,
        stop: str,
        usage: Mapping[str, Any],
    ) -> bytes:
        out = b""
        taken: set[int] = set()
        matched: dict[int, Mapping[str, Any]] = {}
        rest: list[Mapping[str, Any]] = []
        for block in blocks:
            kind = {"text": "content", "thinking": "reasoning_content"}.get(str(block.get("type")))
            live = None if kind is None else self._match(final_call, kind, taken, None)
            if live is None:
                rest.append(block)
            else:
                matched[live.index] = block
        for live in self.live:
            final = matched.get(live.index)
            if final is not None and live.kind == "content":
                text = str(final.get("text") or "")
                if text.startswith(live.text) and len(text) > len(live.text):
                    more = {"type": "text_delta", "text": text[len(live.text) :]}
                    out += _block_event("content_block_delta", live.index, delta=more)
            elif final is not None and final.get("signature"):
                signed = {"type": "signature_delta", "signature": final["signature"]}
                out += _block_event("content_block_delta", live.index, delta=signed)
            out += _block_event("content_block_stop", live.index)
        for block in rest:
            out += self._whole(dict(block))
        ending = {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                  "usage": dict(usage)}  # fmt: skip
        return out + _sse("message_delta", ending) + _sse("message_stop", {"type": "message_stop"})

    def _whole(self, block: dict[str, Any]) -> bytes:
        index = self.count
        self.count += 1
        kind = block.get("type")
        if kind == "text":
            opening: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": block.get("text") or ""}]
        elif kind == "thinking":
            opening = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": block.get("thinking") or ""},
                      {"type": "signature_delta", "signature": block.get("signature") or ""}]  # fmt: skip
        elif kind == "tool_use":
            opening = {**block, "input": {}}
            raw = orjson.dumps(block.get("input") or {}).decode()
            deltas = [{"type": "input_json_delta", "partial_json": raw}]
        else:  # redacted thinking, server tool blocks: whole in the start event
            opening, deltas = block, []
        out = _sse(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": opening},
        )
        for delta in deltas:
            out += _block_event("content_block_delta", index, delta=delta)
        return out + _block_event("content_block_stop", index)

    @staticmethod
    def failed(error: Mapping[str, Any]) -> bytes:
        return _sse("error", {"type": "error", "error": dict(error)})


def _block_event(kind: str, index: int, **fields: Any) -> bytes:
    return _sse(kind, {"type": kind, "index": index, **fields})
