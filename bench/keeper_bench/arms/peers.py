"""Peers: what other libraries ship for a full window, each at its defaults and tuned.

At the defaults only the trigger is sized to the window; tuned, the one setting that decides how
much a summary can keep is set the way a careful user would, so that a peer's score measures its
method rather than a default nobody would ship with:

- ``peer_langchain_summarization``: ``langchain.agents.create_agent`` with
  ``SummarizationMiddleware`` (keeps the last 20 messages, summarises the rest with its own
  prompt, the previous summary included; no running summary). Its default
  ``trim_tokens_to_summarize=4000`` summarises only the last 4,000 tokens of what it evicts;
  ``peer_langchain_summarization_tuned`` sets it to None, so the summary is written from all of it.
- ``peer_langmem_summarization``: langmem's ``SummarizationNode`` before the model node (a running
  summary extended at each call, given to the model as a system message; the stored messages
  are never changed). Its default ``max_summary_tokens=256`` budgets far less than the keeper's
  NOTES may take; ``peer_langmem_summarization_tuned`` gives the summary the same budget as the
  NOTES (and binds it as the summary call's ``max_tokens``, as langmem's documentation advises).

- ``peer_deepagents``: ``deepagents.create_deep_agent`` (the harness LangChain recommends for
  long-running agents) with its own context management: its ``SummarizationMiddleware`` writes
  what it evicts to ``/conversation_history/<session>.md`` in the agent's files, tells the model
  that path, and summarises the history (the previous summary included) with LangChain's prompt;
  its file tools (``ls``, ``read_file``, ``grep``...) and sub-agents come with it. At its defaults
  the thresholds come from the model's profile (``max_input_tokens``: the window here), which
  summarises at 85% and keeps the newest 10%; ``peer_deepagents_tuned`` replaces the middleware
  by name (as its documentation shows) to summarise at 75%, the trigger every arm here shares.

Every peer asks an empty or cut-off work reply once more, by the keeper's rule and policy
(``AnswerRetryMiddleware``; langmem's model node calls ``answer_with_retry``), as every arm does.

Tuned, each peer's summary prompt also asks for every rule and method word for word
(``RULES_KEPT``), as the summarize arm's request does and as the keeper keeps its RULES: a
careful user of a summariser would add it. (The simulated reader keeps every rule in any summary
it writes, so under it the prompt changes no score; a language model may differ.)

All need what ``keeper-bench`` installs (langchain, langmem, deepagents).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Annotated, Any, Literal, TypedDict

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AnyMessage, BaseMessage, SystemMessage
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Checkpointer

from keeper_middleware.config import Size, resolve_size
from keeper_middleware.errors import (
    ConfigurationError,
    InvalidStateError,
    MissingDependencyError,
)
from keeper_middleware.graphs.answer_retry import aanswer_with_retry, answer_with_retry
from keeper_middleware.keeper import Tool

LANGMEM_SUMMARY_TYPE = ("langmem.short_term.summarization", "RunningSummary")
RULES_KEPT = (
    "Rules and methods stated in the conversation stay in force for the rest of it: copy every "
    "one of them into the summary word for word, in a section of their own, whatever else is "
    "left out."
)
"""The rule-keeping sentence a careful user adds to a peer's summary prompt (its tuned setting),
as the summarize arm's own request asks for every rule word for word."""


def rule_keeping(prompt: str) -> str:
    """A LangChain-style summary prompt with ``RULES_KEPT`` as a section of its instructions
    (before its closing tag; at its end when it has none)."""
    closing = "</instructions>"
    if closing in prompt:
        return prompt.replace(closing, f"## RULES\n\n{RULES_KEPT}\n\n{closing}", 1)
    return f"{prompt}\n\n{RULES_KEPT}"


def langmem_rule_keeping_prompts() -> dict[str, Any]:
    """langmem's two summary prompts (a first summary, an extended one) with ``RULES_KEPT``
    after its own request, as ``SummarizationNode`` takes them."""
    from langchain_core.prompts import ChatPromptTemplate

    return {
        "initial_summary_prompt": ChatPromptTemplate.from_messages(
            [
                ("placeholder", "{messages}"),
                ("user", f"Create a summary of the conversation above. {RULES_KEPT}"),
            ]
        ),
        "existing_summary_prompt": ChatPromptTemplate.from_messages(
            [
                ("placeholder", "{messages}"),
                (
                    "user",
                    "This is summary of the conversation so far: {existing_summary}\n\n"
                    f"Extend this summary by taking into account the new messages above. "
                    f"{RULES_KEPT}",
                ),
            ]
        ),
    }


def langchain_summarization_graph(
    model: BaseChatModel,
    *,
    window: int,
    summarize_at: Size = ("fraction", 0.75),
    tools: Sequence[Tool] = (),
    system_prompt: str | None = None,
    checkpointer: Checkpointer = None,
    name: str = "peer_langchain_summarization",
    trim_tokens_to_summarize: int | Literal["default"] | None = "default",
    keep_rules: bool = False,
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """``create_agent`` + ``SummarizationMiddleware(model, trigger=("tokens", summarize_at of
    the window))``; every other setting is the middleware's default unless
    ``trim_tokens_to_summarize`` is given (None: summarise everything evicted) or ``keep_rules``
    (its prompt with the rule-keeping section, ``rule_keeping``)."""
    try:
        from langchain.agents import create_agent
        from langchain.agents.middleware import SummarizationMiddleware

        from keeper_bench.arms.answer_retry import AnswerRetryMiddleware
    except ImportError as error:  # pragma: no cover - depends on the install
        raise MissingDependencyError("langchain", "", distribution="keeper-bench") from error
    trigger = resolve_size(summarize_at, window, name="summarize_at")
    tuned: dict[str, Any] = {}
    if trim_tokens_to_summarize != "default":
        tuned["trim_tokens_to_summarize"] = trim_tokens_to_summarize
    if keep_rules:
        from langchain.agents.middleware.summarization import DEFAULT_SUMMARY_PROMPT

        tuned["summary_prompt"] = rule_keeping(DEFAULT_SUMMARY_PROMPT)
    middleware = SummarizationMiddleware(model, trigger=("tokens", trigger), **tuned)
    graph: CompiledStateGraph[Any, Any, Any, Any] = create_agent(
        model,
        tools=list(tools) or None,  # type: ignore[arg-type]
        system_prompt=system_prompt,
        middleware=[middleware, AnswerRetryMiddleware()],
        checkpointer=checkpointer,
        name=name,
    )
    return graph


class LangmemState(TypedDict, total=False):
    """The state langmem's documentation gives its node: the messages, the model's input, and
    the running summary (in ``context``)."""

    messages: Annotated[list[AnyMessage], add_messages]
    summarized_messages: list[AnyMessage]
    context: dict[str, Any]


def _summarized(state: LangmemState) -> list[AnyMessage]:
    """The model's input the SummarizationNode wrote (it runs before every model call)."""
    summarized = state.get("summarized_messages")
    if summarized is None:
        raise InvalidStateError(
            "langmem's SummarizationNode wrote no summarized_messages before the model call; "
            "the peer's graph must run it first"
        )
    return summarized


def langmem_checkpointer() -> InMemorySaver:
    """An in-memory checkpointer that may restore langmem's ``RunningSummary`` (LangGraph warns
    about, and will later refuse, unregistered types in a checkpoint)."""
    return InMemorySaver(serde=JsonPlusSerializer(allowed_msgpack_modules=[LANGMEM_SUMMARY_TYPE]))


def langmem_summarization_graph(
    model: BaseChatModel,
    *,
    window: int,
    reply_reserve: int,
    summarize_at: Size = ("fraction", 0.75),
    tools: Sequence[Tool] = (),
    system_prompt: str | None = None,
    checkpointer: Checkpointer = None,
    name: str = "peer_langmem_summarization",
    summary_tokens: int | None = None,
    keep_rules: bool = False,
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """``SummarizationNode(model, max_tokens=window - reply_reserve,
    max_tokens_before_summary=summarize_at of the window)`` before the model node, as langmem's
    documentation wires it; every other setting is the node's default unless ``summary_tokens``
    is given: then the summary is budgeted that many tokens (``max_summary_tokens``) and the
    summary call is bound to write no more; ``keep_rules`` adds the rule-keeping sentence to its
    prompts (``langmem_rule_keeping_prompts``). With no ``checkpointer`` an in-memory one that can
    restore the running summary is used."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*Importing Send from langgraph.constants")
            from langmem.short_term import SummarizationNode
    except ImportError as error:  # pragma: no cover - depends on the install
        raise MissingDependencyError("langmem", "", distribution="keeper-bench") from error
    budget = window - reply_reserve
    tuned: dict[str, Any] = {}
    summariser: Runnable[Any, BaseMessage] = model
    if summary_tokens is not None:
        if not 0 < summary_tokens < budget // 2:
            raise ConfigurationError(
                f"summary_tokens={summary_tokens} must be between 1 and half the room left by "
                f"the reply reserve ({budget // 2}); give the NOTES budget of the keeper compared."
            )
        tuned["max_summary_tokens"] = summary_tokens
        summariser = model.bind(max_tokens=summary_tokens)
    if keep_rules:
        tuned.update(langmem_rule_keeping_prompts())
    node = SummarizationNode(
        model=summariser,
        max_tokens=budget,
        max_tokens_before_summary=resolve_size(summarize_at, window, name="summarize_at"),
        **tuned,
    )
    bound: Runnable[Any, BaseMessage] = model.bind_tools(list(tools)) if tools else model
    prompt = [SystemMessage(content=system_prompt)] if system_prompt is not None else []

    def call_model(state: LangmemState, config: RunnableConfig) -> dict[str, Any]:
        return {"messages": [answer_with_retry(bound, [*prompt, *_summarized(state)], config)]}

    async def acall_model(state: LangmemState, config: RunnableConfig) -> dict[str, Any]:
        reply = await aanswer_with_retry(bound, [*prompt, *_summarized(state)], config)
        return {"messages": [reply]}

    graph = StateGraph(LangmemState)
    graph.add_node("summarization", node)
    graph.add_node("model", RunnableLambda(call_model, afunc=acall_model, name="model"))
    graph.add_edge(START, "summarization")
    graph.add_edge("summarization", "model")
    if tools:
        graph.add_node("tools", ToolNode(list(tools)))  # type: ignore[arg-type]
        graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
        graph.add_edge("tools", "summarization")
    else:
        graph.add_edge("model", END)
    saver = checkpointer if checkpointer is not None else langmem_checkpointer()
    return graph.compile(checkpointer=saver, name=name)


DEEPAGENTS_SUMMARY_START = "You are in the middle of a conversation that has been summarized."
"""How Deep Agents' summary message begins (its summary follows between <summary> tags)."""


def deepagents_graph(
    model: BaseChatModel,
    *,
    window: int,
    summarize_at: Size | None = None,
    tools: Sequence[Tool] = (),
    system_prompt: str | None = None,
    checkpointer: Checkpointer = None,
    name: str = "peer_deepagents",
    keep_rules: bool = False,
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """``create_deep_agent(model, tools, system_prompt=...)`` with the model's profile saying its
    window (``max_input_tokens``), so Deep Agents sizes its summarisation from it; every other
    setting is the harness's default unless ``summarize_at`` is given: then its summarisation
    middleware is replaced by one that triggers there (keeping the newest 10% of the window, its
    default), passed as ``middleware=[...]`` under the same name; ``keep_rules`` (with
    ``summarize_at``) gives it its prompt with the rule-keeping section."""
    try:
        from deepagents import create_deep_agent
        from deepagents.backends import StateBackend
        from deepagents.middleware.summarization import (
            DEEPAGENTS_DEFAULT_SUMMARY_PROMPT,
            SummarizationMiddleware,
        )

        from keeper_bench.arms.answer_retry import AnswerRetryMiddleware
    except ImportError as error:  # pragma: no cover - depends on the install
        raise MissingDependencyError("deepagents", "", distribution="keeper-bench") from error
    profiled = model.model_copy(
        update={"profile": {**(model.profile or {}), "max_input_tokens": window}}
    )
    middleware: list[Any] = [AnswerRetryMiddleware()]
    if summarize_at is not None:
        trigger = resolve_size(summarize_at, window, name="summarize_at")
        middleware.append(
            SummarizationMiddleware(
                model=profiled,
                backend=StateBackend(),
                trigger=("tokens", trigger),
                keep=("fraction", 0.10),
                trim_tokens_to_summarize=None,
                summary_prompt=(
                    rule_keeping(DEEPAGENTS_DEFAULT_SUMMARY_PROMPT)
                    if keep_rules
                    else DEEPAGENTS_DEFAULT_SUMMARY_PROMPT
                ),
                truncate_args_settings={
                    "trigger": ("fraction", 0.85),
                    "keep": ("fraction", 0.10),
                },
            )
        )
        middleware.reverse()  # its summarisation outermost, as in the defaults' stack
    graph: CompiledStateGraph[Any, Any, Any, Any] = create_deep_agent(
        profiled,
        list(tools),
        system_prompt=system_prompt,
        middleware=middleware,
        checkpointer=checkpointer,
        name=name,
    )
    return graph
