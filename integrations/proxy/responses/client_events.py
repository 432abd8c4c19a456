"""Server-sent events to a Responses client (pure): ``response.created``,
``response.in_progress``, per output item ``output_item.added``, its deltas,
``output_item.done``, then ``response.completed`` with the whole output. Codex CLI builds its
items from ``output_item.done`` and ends the turn on ``response.completed``; the Agents SDK reads
``response.completed`` only.

One client response can span several upstream calls (the proxy's archive searches run between
them): items are numbered across all of them (``output_index``, ``sequence_number``), text one
call passed on stays in the item it opened, and the answer's own items follow, so the client sees
one coherent response.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from keeper_middleware.integrations.proxy.conversation.native_events import Live, Writer, sse
from keeper_middleware.integrations.proxy.conversation.pieces import StreamPiece
from keeper_middleware.integrations.proxy.conversation.wire import item_id
from keeper_middleware.integrations.proxy.responses.replies import output_message

__all__ = ["ResponsesWriter"]


@dataclass
class ResponsesWriter(Writer):
    """One streamed Responses answer."""

    skeleton: dict[str, Any] = field(default_factory=dict)
    """The response object as ``response.created`` shows it (status ``in_progress``)."""
    sequence: int = 0
    done: list[dict[str, Any]] = field(default_factory=list)

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return sse(kind, payload)

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

    def _open(self, live: Live) -> bytes:
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

    def _close(self, live: Live, item: Mapping[str, Any]) -> bytes:
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


def _closed(live: Live) -> dict[str, Any]:
    if live.kind == "content":
        return output_message(live.id, live.text)
    return {
        "id": live.id,
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": live.text}],
    }
