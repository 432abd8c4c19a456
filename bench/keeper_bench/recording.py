"""Recording every chat-model call of a run as a ``CallRecord``, through LangChain callbacks.

A handler passed in a graph's invoke config reaches every model call made inside its nodes,
the keeper's note calls included (LangChain carries the config in a context variable), so one
handler sees the agent's work calls and all management calls without any arm knowing about it.

Every version of a summarising arm's memory is handed to ``summary_sink``: the summary a work
call carries, each time it differs from the one before (an empty one included), with the last
item the summary call before it read. It is read from what the reader was sent, so it is the
memory the arm kept (a guard that refused an empty reply kept the old one), and the summaries are
audited like the keeper's NOTES.

Per call: what it was for (from the keeper's tag on the last message, or a summary request's
text), the tokens the server reported, a fingerprint of what was sent (for prefix reuse), and two
times: ``model_seconds`` inside the call, and ``wall_seconds`` from the end of the previous call
(or the start of the run) to the end of this one, so the run's own overhead (the keeper, the
retriever, the graph) is counted once and the wall times add up to the run's time.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, BaseMessage, SystemMessage, ToolMessage
from langchain_core.outputs import LLMResult

from keeper_bench.costs import CallRecord
from keeper_bench.reader.summary import is_summary_request, summary_in
from keeper_bench.reader.text import BATCH_HEAD_WORD
from keeper_middleware.messages.facts import keeper_kind, text_of

_KIND_BY_TAG = {"notes_request": "notes", "notes_reask": "reask", "summary_request": "summary"}
_ITEM_HEADER = re.compile(rf"(?<![\w]){BATCH_HEAD_WORD} (\d+)\.")


def last_item_in(messages: Sequence[BaseMessage]) -> int | None:
    """The highest item whose batch header ("Item N.") the messages hold: what a summary of
    them covers."""
    numbers = [int(n) for m in messages for n in _ITEM_HEADER.findall(text_of(m))]
    return max(numbers, default=None)


def call_kind(messages: Sequence[BaseMessage]) -> str:
    """ "work", or the management a call was for: "notes", "reask" or "summary" (a summary asked
    for by the summarize arm's tag, or by LangChain's or langmem's own prompt)."""
    if not messages:
        return "work"
    tagged = keeper_kind(messages[-1])
    if tagged in _KIND_BY_TAG:
        return _KIND_BY_TAG[tagged]
    return "summary" if is_summary_request(messages) else "work"


def _digest(payload: Any) -> str:
    raw = json.dumps(payload, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def _message_payload(message: BaseMessage) -> list[Any]:
    payload: list[Any] = [message.type, text_of(message)]
    if isinstance(message, AIMessage) and message.tool_calls:
        payload.append(
            [[call["name"], call["args"], call.get("id")] for call in message.tool_calls]
        )
    if isinstance(message, ToolMessage):
        payload.append(message.tool_call_id)
    return payload


def request_fingerprint(messages: Sequence[BaseMessage], tools: Any = None) -> tuple[str, ...]:
    """One hash for the tools and leading system messages, then one per remaining message."""
    head = 0
    while head < len(messages) and isinstance(messages[head], SystemMessage):
        head += 1
    first = _digest([tools or [], [text_of(m) for m in messages[:head]]])
    return (first, *(_digest(_message_payload(m)) for m in messages[head:]))


def approx_tokens(messages: Sequence[BaseMessage]) -> int:
    """About four characters a token: the fallback when a server reports no usage."""
    return sum(len(text_of(m)) + 3 for m in messages) // 4


def usage_counts(
    message: BaseMessage | None, sent: Sequence[BaseMessage]
) -> tuple[int, int, int | None]:
    """(prompt, completion, cached) tokens from a reply's usage; estimated when it has none."""
    usage = getattr(message, "usage_metadata", None) if message is not None else None
    if not usage:
        completion = approx_tokens([message]) if message is not None else 0
        return approx_tokens(sent), completion, None
    details = usage.get("input_token_details") or {}
    cached = details.get("cache_read")
    return (
        int(usage.get("input_tokens", 0)),
        int(usage.get("output_tokens", 0)),
        int(cached) if cached is not None else None,
    )


class CallRecorder(BaseCallbackHandler):
    """A callback handler that turns each chat-model call into a ``CallRecord``.

    Set ``item`` as the run moves through the stream; ``sink`` (if given) receives each record as
    soon as the call ends, so a run killed mid-way keeps the calls it paid for, and the records
    are not also kept in memory (a 10M-token run makes tens of thousands of calls); without a
    sink they collect in ``records``.
    """

    run_inline = True
    sees_keeper_calls = True
    """The keeper's own note calls are kept from user handlers; a run's cost must count them."""

    def __init__(
        self,
        *,
        start_index: int = 0,
        sink: Callable[[CallRecord], None] | None = None,
        summary_sink: Callable[[int, str], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.item = 0
        self.records: list[CallRecord] = []
        self._next_index = start_index
        self._sink = sink
        self._summary_sink = summary_sink
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: dict[UUID, tuple[str, tuple[str, ...], list[BaseMessage], float]] = {}
        self._last_end = clock()
        self._summary: str | None = None
        """The summary the last work call carried (None: none yet)."""
        self._summarised_item: int | None = None
        """The last item the latest summary call read."""

    def restart_clock(self) -> None:
        """Count wall time from now (after a pause the run should not be charged for)."""
        self._last_end = self._clock()

    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        invocation_params: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        sent = list(messages[0]) if messages else []
        tools = (invocation_params or {}).get("tools")
        kind = call_kind(sent)
        version: tuple[int, str] | None = None
        with self._lock:
            self._pending[run_id] = (kind, request_fingerprint(sent, tools), sent, self._clock())
            if kind == "summary":  # it re-reads the summary before it: never covers less
                found = last_item_in(sent) or self.item
                self._summarised_item = max(self._summarised_item or 0, found)
            elif kind == "work":
                carried = summary_in(sent)
                if carried is not None and carried != self._summary:
                    self._summary = carried
                    version = (self._summarised_item or self.item, carried)
        if version is not None and self._summary_sink is not None:
            self._summary_sink(*version)

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            pending = self._pending.pop(run_id, None)
            if pending is None:
                return
            kind, fingerprint, sent, started = pending
            ended = self._clock()
            generation = response.generations[0][0] if response.generations else None
            reply = getattr(generation, "message", None)
            prompt, completion, cached = usage_counts(reply, sent)
            record = CallRecord(
                index=self._next_index,
                kind=kind,
                prompt_tokens=prompt,
                completion_tokens=completion,
                cached_tokens=cached,
                request_fingerprint=fingerprint,
                wall_seconds=max(0.0, ended - min(started, self._last_end)),
                model_seconds=max(0.0, ended - started),
                item=self.item,
            )
            self._next_index += 1
            self._last_end = ended
            if self._sink is None:
                self.records.append(record)
        if self._sink is not None:
            self._sink(record)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            self._pending.pop(run_id, None)
