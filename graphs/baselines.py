"""The lossy baselines as graphs: window-drop, compaction, and a summary at a threshold.

Each is one context node before the model node (and the tool loop back to it), so it runs before
every model call, like the keeper. What each keeps is decided by pure functions over the message
list; the nodes only count tokens, call the model (the summary) and write the state update.

A "turn" starts at each user input (a user message that is not the context manager's own); the
oldest turns go first, and a cut never splits a tool call from its results. The system prompt and
the first ``pinned_head`` user messages (the task) always stay.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    RemoveMessage,
    ToolMessage,
)
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import REMOVE_ALL_MESSAGES, add_messages
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Checkpointer

from keeper_middleware.config import Size, ThinkingPolicy, resolve_size
from keeper_middleware.errors import ConfigurationError, WindowTooSmallError
from keeper_middleware.graphs.answer_retry import (
    ANSWER_RETRY,
    aanswer_with_retry,
    answer_with_retry,
)
from keeper_middleware.keeper import ModelSetup, Tool
from keeper_middleware.messages.facts import (
    is_input,
    keeper_kind,
    keeper_message,
    safe_boundary,
    strip_reasoning,
    text_of,
)
from keeper_middleware.step.cut import find_layout
from keeper_middleware.tokens.counting import TokenCounter, resolve_token_counter

SUMMARY_REQUEST_TAG = "[SUMMARY REQUEST]"
SUMMARY_REQUEST_TEXT = (
    f"{SUMMARY_REQUEST_TAG} The conversation is about to outgrow the window. Write a summary of "
    "everything above that the rest of the work needs: the task, every rule and method stated, "
    "word for word, the current state (values, facts, progress) and any open questions. The "
    "summary replaces the turns above; they will be gone."
)
SUMMARY_BUDGET: Size = ("fraction", 0.125)
"""A summary's budget by default: an eighth of the window. Keep it equal to the keeper's NOTES
budget, so that a summary and the NOTES are measured at one size."""
SUMMARY_HEADER = "[SUMMARY] Summary of the conversation so far (it replaces the earlier turns):"
STUB_TEXT = "[cleared: old tool output]"
Fits = Callable[[Sequence[BaseMessage]], bool]


class ArmState(TypedDict):
    """The state every baseline graph keeps: the messages in view."""

    messages: Annotated[list[AnyMessage], add_messages]


def default_reply_reserve(window: int) -> int:
    """Room kept for the reply: 4,096 tokens, or an eighth of a small window."""
    return min(4096, window // 8)


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowPolicy:
    """The live window a baseline keeps its requests inside."""

    window: int
    """The live window in tokens: no request sent is larger than ``window - reply_reserve``."""
    reply_reserve: int
    """Tokens kept free for the model's reply."""
    pinned_head: int = 1
    """How many leading user messages (the task) stay in view for ever."""

    def __post_init__(self) -> None:
        if self.window < 256:
            raise ConfigurationError(f"window={self.window} is too small; use at least 256 tokens")
        if not 0 <= self.reply_reserve < self.window // 2:
            raise ConfigurationError(
                f"reply_reserve={self.reply_reserve} must be between 0 and half the window "
                f"({self.window // 2})"
            )
        if self.pinned_head < 0:
            raise ConfigurationError("pinned_head must be 0 or more")

    @property
    def budget(self) -> int:
        return self.window - self.reply_reserve


@dataclass(frozen=True, slots=True)
class RequestSize:
    """Counts a request the way it is sent: system prompt, tool schemas and messages."""

    setup: ModelSetup
    counter: TokenCounter
    budget: int

    def of(self, messages: Sequence[BaseMessage]) -> int:
        return self.counter.count_messages(self.setup.render(messages), self.setup.tool_schemas)

    def fits(self, messages: Sequence[BaseMessage]) -> bool:
        return self.of(messages) <= self.budget


# ------------------------------------------------------------------------- pure decisions


def head_end(messages: Sequence[BaseMessage], pinned_head: int) -> int:
    """Index after the stored system message (if any) and the pinned task messages."""
    return find_layout(messages, pinned_head=pinned_head, kept=0).head_end


def turn_starts(messages: Sequence[BaseMessage], start: int) -> list[int]:
    """Where each turn after ``start`` begins: at a user input."""
    return [i for i in range(start, len(messages)) if is_input(messages[i])]


def safe_starts(messages: Sequence[BaseMessage], start: int) -> list[int]:
    """Every index after ``start`` where a cut splits no tool call from its results."""
    return sorted({safe_boundary(messages, i) for i in range(start, len(messages))} - {0})


def drop_oldest(messages: Sequence[BaseMessage], start: int, fits: Fits) -> list[BaseMessage]:
    """The messages with the oldest turns after ``start`` dropped, until the request fits.

    Whole turns go first; only when the newest turn alone is too big does the cut fall inside
    it (still never between a tool call and its results).
    """
    if fits(messages):
        return list(messages)
    head = list(messages[:start])
    starts = turn_starts(messages, start + 1)
    inner = [i for i in safe_starts(messages, (starts or [start])[-1] + 1) if i > start]
    for index in [*starts, *inner]:
        kept = [*head, *messages[index:]]
        if fits(kept):
            return kept
    raise WindowTooSmallError(
        "the system prompt, the task and the newest message do not fit the window even after "
        "every older turn was dropped; raise the window, lower reply_reserve, or send smaller "
        "inputs."
    )


def compact(
    messages: Sequence[BaseMessage], start: int, *, keep_tool_results: int, stub: str = STUB_TEXT
) -> list[BaseMessage]:
    """Old tool output replaced by a stub and old reasoning removed (same ids, so they replace).

    The newest ``keep_tool_results`` tool results keep their text; reasoning is removed from
    every reply before the newest turn.
    """
    tool_indices = [i for i in range(start, len(messages)) if isinstance(messages[i], ToolMessage)]
    stubbed = set(tool_indices[: max(0, len(tool_indices) - keep_tool_results)])
    starts = turn_starts(messages, start)
    newest_turn = starts[-1] if starts else len(messages)
    result: list[BaseMessage] = []
    for index, message in enumerate(messages):
        if index in stubbed and text_of(message) != stub:
            message = message.model_copy(update={"content": stub})
        elif isinstance(message, AIMessage) and start <= index < newest_turn:
            message = strip_reasoning(message)
            message = message.model_copy(
                update={
                    "response_metadata": {
                        k: v
                        for k, v in message.response_metadata.items()
                        if k != "keeper_reasoning"
                    }
                }
            )
        result.append(message)
    return result


def summary_boundary(messages: Sequence[BaseMessage], start: int, keep_turns: int) -> int | None:
    """Where the kept turns begin: everything from ``start`` up to it is summarised (None:
    there are no more than ``keep_turns`` turns, nothing to summarise)."""
    starts = turn_starts(messages, start)
    if len(starts) <= keep_turns:
        return None
    boundary = starts[-keep_turns] if keep_turns else len(messages)
    return boundary if boundary > start else None


def summary_request_text(budget: int) -> str:
    """The request, with the summary's budget stated so that the summariser can keep to it."""
    return f"{SUMMARY_REQUEST_TEXT} Keep it within {budget} tokens."


def summary_request(
    messages: Sequence[BaseMessage], start: int, boundary: int, fits: Fits, *, budget: int
) -> list[BaseMessage]:
    """The messages a summary is asked from (before rendering): the head, then the turns being
    summarised (the oldest left out if they do not fit), then the request.

    The request is appended to the conversation as it was sent, like the keeper's notes request,
    so the server's prefix cache serves it.
    """
    request = keeper_message(summary_request_text(budget), "summary_request")
    if start < len(messages) and is_summary(messages[start]):
        start += 1  # the previous summary is always summarised again, never left out
    head = list(messages[:start])
    starts = [start, *(i for i in turn_starts(messages, start + 1) if i < boundary)]
    for first in starts:
        asked = [*head, *messages[first:boundary], request]
        if fits(asked):
            return asked
    return [*head, request]


def summary_message(text: str) -> BaseMessage:
    return keeper_message(
        f"{SUMMARY_HEADER}\n{text.strip()}", "summary", msg_id=f"summary-{uuid.uuid4().hex}"
    )


def messages_update(given: Sequence[BaseMessage], new: Sequence[BaseMessage]) -> dict[str, Any]:
    """The graph update from ``given`` to ``new``: nothing, appended messages, removals and
    in-place replacements, or (when messages were inserted) the whole list rewritten."""
    if [(m.id, m.content) for m in given] == [(m.id, m.content) for m in new]:
        return {}
    if [m.id for m in new[: len(given)]] == [m.id for m in given] and all(
        a.content == b.content for a, b in zip(given, new, strict=False)
    ):
        return {"messages": list(new[len(given) :])}
    given_ids = [m.id for m in given]
    new_ids = [m.id for m in new]
    remaining = [i for i in given_ids if i in set(new_ids)]
    if remaining == new_ids:  # only removals and replacements
        removed = [RemoveMessage(id=str(i)) for i in given_ids if i not in set(new_ids)]
        before = {m.id: m.content for m in given}
        replaced = [m for m in new if before[m.id] != m.content]
        return {"messages": [*removed, *replaced]}
    return {"messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), *new]}


# ------------------------------------------------------------------------- graph pieces


class ModelCall:
    """The model node: the system prompt rendered in, the tools bound (only when there are any),
    and an empty or cut-off reply asked again by ``retry`` (the keeper's policy by default)."""

    def __init__(
        self,
        model: BaseChatModel,
        setup: ModelSetup,
        *,
        retry: ThinkingPolicy | None = ANSWER_RETRY,
    ) -> None:
        self.setup = setup
        self.retry = retry
        self.bound: Runnable[Any, BaseMessage] = (
            model.bind_tools(list(setup.tools)) if setup.tools else model
        )

    def __call__(self, state: ArmState, config: RunnableConfig) -> dict[str, Any]:
        messages = self.setup.render(state["messages"])
        return {"messages": [answer_with_retry(self.bound, messages, config, self.retry)]}

    async def acall(self, state: ArmState, config: RunnableConfig) -> dict[str, Any]:
        messages = self.setup.render(state["messages"])
        return {"messages": [await aanswer_with_retry(self.bound, messages, config, self.retry)]}

    def runnable(self) -> Runnable[Any, Any]:
        return RunnableLambda(self.__call__, afunc=self.acall, name="model")


def assemble(
    state_schema: type[Any],
    node_name: str,
    node: Runnable[Any, Any],
    model_call: ModelCall,
    *,
    tools: Sequence[Tool],
    checkpointer: Checkpointer,
    name: str,
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """context node → model → (tools → context node)*; without tools the model ends the turn."""
    graph = StateGraph(state_schema)
    graph.add_node(node_name, node)
    graph.add_node("model", model_call.runnable())
    graph.add_edge(START, node_name)
    graph.add_edge(node_name, "model")
    if tools:
        graph.add_node("tools", ToolNode(list(tools)))  # type: ignore[arg-type]
        graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
        graph.add_edge("tools", node_name)
    else:
        graph.add_edge("model", END)
    return graph.compile(checkpointer=checkpointer, name=name)


def _sizer(
    policy: WindowPolicy,
    tools: Sequence[Tool],
    system_prompt: str | None,
    token_counter: TokenCounter | str | None,
) -> RequestSize:
    setup = ModelSetup(system_prompt=system_prompt, tools=tuple(tools))
    return RequestSize(setup, resolve_token_counter(token_counter), policy.budget)


def _plain_node(transform: Callable[[list[BaseMessage]], list[BaseMessage]], name: str) -> Any:
    def run(state: ArmState) -> dict[str, Any]:
        given: list[BaseMessage] = list(state["messages"])
        return messages_update(given, transform(given))

    async def arun(state: ArmState) -> dict[str, Any]:
        return run(state)

    return RunnableLambda(run, afunc=arun, name=name)


def window_drop_graph(
    model: BaseChatModel,
    *,
    policy: WindowPolicy,
    tools: Sequence[Tool] = (),
    system_prompt: str | None = None,
    token_counter: TokenCounter | str | None = None,
    checkpointer: Checkpointer = None,
    name: str = "window_drop",
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """When the window fills, the oldest turns are dropped; nothing is kept."""
    size = _sizer(policy, tools, system_prompt, token_counter)

    def transform(messages: list[BaseMessage]) -> list[BaseMessage]:
        return drop_oldest(messages, head_end(messages, policy.pinned_head), size.fits)

    node = _plain_node(transform, "drop_oldest")
    return assemble(
        ArmState,
        "drop_oldest",
        node,
        ModelCall(model, size.setup),
        tools=tools,
        checkpointer=checkpointer,
        name=name,
    )


def compaction_graph(
    model: BaseChatModel,
    *,
    policy: WindowPolicy,
    keep_tool_results: int = 3,
    tools: Sequence[Tool] = (),
    system_prompt: str | None = None,
    token_counter: TokenCounter | str | None = None,
    checkpointer: Checkpointer = None,
    name: str = "compaction",
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """When the window fills, old tool output becomes a stub and old reasoning goes; then, if it
    still does not fit, the oldest turns are dropped."""
    if keep_tool_results < 0:
        raise ConfigurationError("keep_tool_results must be 0 or more")
    size = _sizer(policy, tools, system_prompt, token_counter)

    def transform(messages: list[BaseMessage]) -> list[BaseMessage]:
        if size.fits(messages):
            return messages
        start = head_end(messages, policy.pinned_head)
        compacted = compact(messages, start, keep_tool_results=keep_tool_results)
        return drop_oldest(compacted, start, size.fits)

    node = _plain_node(transform, "compact")
    return assemble(
        ArmState,
        "compact",
        node,
        ModelCall(model, size.setup),
        tools=tools,
        checkpointer=checkpointer,
        name=name,
    )


class SummarizeNode:
    """At ``summarize_at`` of the window, the model summarises the older turns and the summary
    replaces them; the newest ``keep_turns`` turns stay. The previous summary is one of the
    things summarised, so one bad summary loses everything before it (that is the method).

    An empty reply is asked for once more (after it, with a line saying it was empty); if that
    is empty too, nothing is replaced and the next call asks again: the guard any careful
    implementer writes, since an empty summary in place of the turns loses all of them."""

    def __init__(
        self,
        model_call: ModelCall,
        size: RequestSize,
        *,
        policy: WindowPolicy,
        summarize_at: Size,
        keep_turns: int,
        summary_tokens: Size = SUMMARY_BUDGET,
    ) -> None:
        if keep_turns < 1:
            raise ConfigurationError("keep_turns must be 1 or more (the newest input stays)")
        self.model_call = model_call
        self.size = size
        self.policy = policy
        self.threshold = resolve_size(summarize_at, policy.window, name="summarize_at")
        self.keep_turns = keep_turns
        self.summary_tokens = resolve_size(summary_tokens, policy.window, name="summary_tokens")

    def _plan(self, messages: list[BaseMessage]) -> tuple[int, int] | None:
        if self.size.of(messages) < self.threshold:
            return None
        start = head_end(messages, self.policy.pinned_head)
        boundary = summary_boundary(messages, start, self.keep_turns)
        return None if boundary is None else (start, boundary)

    def _finish(
        self, messages: list[BaseMessage], plan: tuple[int, int] | None, reply: BaseMessage | None
    ) -> dict[str, Any]:
        """Put the summary in place of the turns it covers; a summary still empty after the
        second request replaces nothing (the turns stay, and the next call asks again)."""
        result = messages
        if plan is not None and reply is not None and not is_empty_summary(reply):
            start, boundary = plan
            text = text_of(strip_reasoning(reply) if isinstance(reply, AIMessage) else reply)
            result = [*messages[:start], summary_message(text), *messages[boundary:]]
        start = head_end(result, self.policy.pinned_head)
        if start < len(result) and is_summary(result[start]):
            start += 1  # the summary stays with the head
        return messages_update(messages, drop_oldest(result, start, self.size.fits))

    def _request(self, messages: list[BaseMessage], plan: tuple[int, int]) -> list[BaseMessage]:
        start, boundary = plan
        asked = summary_request(
            messages, start, boundary, self.size.fits, budget=self.summary_tokens
        )
        return self.size.setup.render(asked)

    def __call__(self, state: ArmState, config: RunnableConfig) -> dict[str, Any]:
        messages: list[BaseMessage] = list(state["messages"])
        plan = self._plan(messages)
        reply = None
        if plan is not None:
            request = self._request(messages, plan)
            reply = self.model_call.bound.invoke(request, config)
            if is_empty_summary(reply):
                reply = self.model_call.bound.invoke(self._again(request, reply), config)
        return self._finish(messages, plan, reply)

    async def acall(self, state: ArmState, config: RunnableConfig) -> dict[str, Any]:
        messages: list[BaseMessage] = list(state["messages"])
        plan = self._plan(messages)
        reply = None
        if plan is not None:
            request = self._request(messages, plan)
            reply = await self.model_call.bound.ainvoke(request, config)
            if is_empty_summary(reply):
                reply = await self.model_call.bound.ainvoke(self._again(request, reply), config)
        return self._finish(messages, plan, reply)

    def _again(self, request: list[BaseMessage], reply: BaseMessage) -> list[BaseMessage]:
        """The request once more, after the empty reply and a line saying so (the same request
        sent again would get the same reply from a model at temperature 0)."""
        return [
            *request,
            AIMessage(content=text_of(reply)),
            keeper_message(
                f"{SUMMARY_REQUEST_TAG} Your reply was empty. Write the summary now, within "
                f"{self.summary_tokens} tokens.",
                "summary_request",
            ),
        ]


def summarize_graph(
    model: BaseChatModel,
    *,
    policy: WindowPolicy,
    summarize_at: Size = ("fraction", 0.75),
    keep_turns: int = 2,
    summary_tokens: Size = SUMMARY_BUDGET,
    tools: Sequence[Tool] = (),
    system_prompt: str | None = None,
    token_counter: TokenCounter | str | None = None,
    checkpointer: Checkpointer = None,
    name: str = "summarize",
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """A summary written by the model, within ``summary_tokens`` (stated in the request),
    replaces the older turns at 75% of the window."""
    size = _sizer(policy, tools, system_prompt, token_counter)
    model_call = ModelCall(model, size.setup)
    node = SummarizeNode(
        model_call,
        size,
        policy=policy,
        summarize_at=summarize_at,
        keep_turns=keep_turns,
        summary_tokens=summary_tokens,
    )
    return assemble(
        ArmState,
        "summarize",
        RunnableLambda(node.__call__, afunc=node.acall, name="summarize"),
        model_call,
        tools=tools,
        checkpointer=checkpointer,
        name=name,
    )


def is_summary(message: BaseMessage) -> bool:
    return keeper_kind(message) == "summary"


def is_empty_summary(reply: BaseMessage) -> bool:
    """A summary reply with no text (an empty reply, or one that spent its budget thinking):
    put in place of the turns it would lose them all."""
    text = text_of(strip_reasoning(reply) if isinstance(reply, AIMessage) else reply)
    return not text.strip()
