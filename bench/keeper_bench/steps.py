"""The steps of a run: the stream turned into the graph invokes the benchmark makes.

Kept apart from the run loop (``runner.py``) because the plan is pure (records in, steps out) and
is shared: the proxy benchmarks send the same steps, the same task text and system prompt, over
HTTP. ``BatchFeeder`` is here too because it serves a step's batches (``--delivery tool``); what
it saves goes through the runner's progress file, so a replayed tool call gets the same batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from langchain_core.tools import InjectedToolCallId, StructuredTool

from keeper_bench.reader.messages import NO_MORE_BATCHES, READ_TOOL
from keeper_bench.recording import CallRecorder

SYSTEM_PROMPT = "You read stories about counters and answer questions about them."
TASK_MESSAGES = (
    "Task: stories about counters arrive as numbered items, one message each. Keep track of "
    "every counter, follow the standing rules and methods the stories give, and when questions "
    'come, answer each on its own line as "N. answer".'
)
TASK_TOOL = (
    "Task: stories about counters arrive as numbered items. Call read_next_batch (no arguments) "
    f'until it answers "{NO_MORE_BATCHES}" Keep track of every counter, follow the standing '
    "rules and methods the stories give, and when questions come, answer each on its own line "
    'as "N. answer".'
)
CONTINUE_TOOL = f'More items have arrived: call read_next_batch (no arguments) until it answers "{NO_MORE_BATCHES}"'


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """One invoke of the graph: a user message and, with tool delivery, the batches it reads."""

    index: int
    message: str
    batches: tuple[str, ...] = ()
    question: Mapping[str, Any] | None = None
    first_item: int
    last_item: int
    history_tokens: int


def plan_steps(records: Iterable[Mapping[str, Any]], delivery: str) -> Iterator[Step]:
    """The task, then one step per batch and per question set (``messages``), or one reading
    step per run of batches between question sets (``tool``; the first one is the task)."""
    index, chars, item, first = 0, 0, 0, 0
    pending: list[str] = []
    if delivery == "messages":
        yield Step(index=0, message=TASK_MESSAGES, first_item=0, last_item=0, history_tokens=0)
        index = 1

    def reading() -> Step:
        return Step(
            index=index,
            message=TASK_TOOL if index == 0 else CONTINUE_TOOL,
            batches=tuple(pending),
            first_item=first,
            last_item=item,
            history_tokens=chars // 4,
        )

    for record in records:
        chars += len(record["text"])
        if record["type"] == "batch":
            item = int(record["item"])
            if delivery == "tool":
                first = first if pending else item
                pending.append(record["text"])
                continue
            yield Step(
                index=index,
                message=record["text"],
                first_item=item,
                last_item=item,
                history_tokens=chars // 4,
            )
            index += 1
            continue
        if delivery == "tool" and (pending or index == 0):
            yield reading()
            index, pending = index + 1, []
        yield Step(
            index=index,
            message=record["text"],
            question=record,
            first_item=item,
            last_item=item,
            history_tokens=chars // 4,
        )
        index += 1
    if delivery == "tool" and pending:
        yield reading()


class BatchFeeder:
    """Serves a step's batches to ``read_next_batch``. What each tool call got is saved by its
    call id, so a tool call replayed after an interruption gets the same batch again."""

    def __init__(
        self, progress: dict[str, Any], save: Callable[..., None], recorder: CallRecorder
    ) -> None:
        self.progress, self.save, self.recorder = progress, save, recorder
        self.step: Step | None = None
        self.tool = StructuredTool.from_function(
            self._read,
            name=READ_TOOL,
            description=f'Read the next batch of stories. Call it until it answers "{NO_MORE_BATCHES}"',
        )

    def begin(self, step: Step) -> None:
        self.step = step

    def _read(self, tool_call_id: Annotated[str, InjectedToolCallId]) -> str:
        step = self.step
        if step is None:
            return NO_MORE_BATCHES
        served: dict[str, int] = dict(self.progress.get("served") or {})
        position = served.get(tool_call_id)
        if position is None:
            position = sum(1 for p in served.values() if p >= 0)
            position = position if position < len(step.batches) else -1
            self.save(served={**served, tool_call_id: position})
        if position < 0:
            return NO_MORE_BATCHES
        self.recorder.item = step.first_item + position
        return step.batches[position]
