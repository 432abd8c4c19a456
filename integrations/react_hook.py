"""The keeper as LangGraph's ``create_react_agent`` ``pre_model_hook`` (sync and async).

Only converts formats, as :class:`~keeper_middleware.KeeperNode` does; the decisions are the
engine's. Needs LangGraph only (the ``create_agent`` middleware, which needs LangChain v1, is
:mod:`~keeper_middleware.integrations.langchain`, which also names everything here).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, NotRequired, TypedDict

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda
from langgraph.config import get_config
from langgraph.graph.message import add_messages
from langgraph.managed import RemainingSteps
from langgraph.runtime import Runtime

from keeper_middleware.agent import make_keeper
from keeper_middleware.archive.store import ArchiveStore
from keeper_middleware.config import KeeperConfig
from keeper_middleware.keeper import Keeper, Tool
from keeper_middleware.messages.facts import as_ai_message
from keeper_middleware.node import (
    KeeperNode,
)
from keeper_middleware.retrievers.factory import RetrieverSpec
from keeper_middleware.search.tool import DEFAULT_SESSION, session_of
from keeper_middleware.state_view import (
    KEEPER_STATE_KEY,
    model_view,
)
from keeper_middleware.tokens.counting import TokenCounter

log = logging.getLogger(__name__)

__all__ = [
    "KeeperPreModelHook",
    "KeeperReactState",
    "composed_input",
    "keeper_pre_model_hook",
    "run_session",
]


class KeeperReactState(TypedDict):
    """``create_react_agent``'s state plus the keeper's bookkeeping (pass it as
    ``state_schema``: a hook's update to a key the schema lacks is silently dropped)."""

    messages: Annotated[Sequence[AnyMessage], add_messages]
    remaining_steps: NotRequired[RemainingSteps]
    keeper: NotRequired[dict[str, Any]]


def run_session(runtime: Runtime[Any] | None) -> str:
    """The thread id of the run (the session the archive is kept under), else "default"."""
    info = getattr(runtime, "execution_info", None)
    thread = getattr(info, "thread_id", None)
    if thread is not None:
        return str(thread)
    try:
        return session_of(get_config())
    except RuntimeError:  # called outside a graph run (a hand-built request in a test)
        return DEFAULT_SESSION


class KeeperPreModelHook(RunnableLambda[Any, dict[str, Any]]):
    """A :class:`KeeperNode` as ``create_react_agent``'s ``pre_model_hook`` (sync and async).

    Given :attr:`model` (``create_react_agent(hook.model, ...)``), the keeper's messages stay in
    its state channel and :attr:`model` puts them into the model's input
    (``state_messages="window"`` by default); the hook returns ``messages`` updates for the
    state's own messages only (on a cut, ``RemoveMessage(REMOVE_ALL_MESSAGES)`` plus the new
    window, so the checkpoint shrinks). It never sets ``llm_input_messages``: LangGraph streams
    every message a node returns, so the NOTES there would reach ``stream_mode="messages"``, and
    that channel keeps its last value for the next call. An agent given a model of its own
    reads ``state["messages"]`` as they are, so the RULES and NOTES are written there
    (``"window_with_keeper"``, marked). Bind ``hook.tools`` (yours plus the archive search tool).
    """

    def __init__(self, node: KeeperNode) -> None:
        super().__init__(self._before, afunc=self._abefore, name="keeper")
        self.node = node
        self._withholding = False
        """Whether :attr:`model` or :attr:`after_model` has run: the agent can withhold the
        search tool after the stop line."""
        self._warned = False
        self._composes = False
        """Whether :attr:`model` was taken (for ``create_react_agent``): it composes the
        model's input, so the keeper's messages can stay out of ``messages``."""
        self._warned_composed = False

    def _check_composed(self) -> None:
        """``state_messages`` set to keep the keeper's messages out of ``messages`` needs the
        model's input composed by :attr:`model`: say so once when the agent has another."""
        node = self.node
        if self._composes or self._warned_composed or node.state_messages == "window_with_keeper":
            return
        self._warned_composed = True
        log.warning(
            "state_messages=%r needs create_react_agent(hook.model, ...), which puts the "
            "keeper's NOTES and RULES into the model's input; this agent has a model of its "
            "own, which will not see them: pass hook.model, or state_messages="
            "'window_with_keeper'",
            node.state_messages,
        )

    def _before(self, state: Mapping[str, Any], config: RunnableConfig) -> dict[str, Any]:
        self._check_composed()
        update = self.node(state, config)
        self._warn_unless_withheld(session_of(config), state.get("messages", []))
        return update

    async def _abefore(self, state: Mapping[str, Any], config: RunnableConfig) -> dict[str, Any]:
        self._check_composed()
        update = await self.node.acall(state, config)
        await asyncio.to_thread(
            self._warn_unless_withheld, session_of(config), state.get("messages", [])
        )
        return update

    def _warn_unless_withheld(self, session: str, messages: Sequence[BaseMessage]) -> None:
        """Past the stop line, an agent given neither :attr:`model` nor :attr:`after_model`
        still offers the search tool: say so once, naming the two."""
        if self._withholding or self._warned or self.node.search_tool is None:
            return
        if self.node.keeper.search_offered(session, messages):
            return
        self._warned = True
        log.warning(
            "session=%s: the search tool's stop line was given, but this create_react_agent "
            "still offers search_archive to its model; give it hook.model, or "
            "post_model_hook=hook.after_model, or a model that never stops searching runs on "
            "to the recursion limit",
            session,
        )

    @property
    def keeper(self) -> Keeper:
        return self.node.keeper

    @property
    def model(self) -> Callable[[Mapping[str, Any], Runtime[Any]], Runnable[Any, BaseMessage]]:
        """The model to give ``create_react_agent`` (a dynamic model): bound to
        :attr:`tools`, and after the search tool's stop line to them without it, its replies'
        search calls dropped, so a model that never stops searching ends with an answer. It
        puts the keeper's NOTES and RULES into the model's input, so taking it keeps them out
        of ``state["messages"]`` (``state_messages="window"``) unless the config says
        otherwise."""
        self._composes = True
        if self.node.keeper.config.state_messages is None:
            self.node.state_messages = "window"
        return self._work_model

    def _work_model(
        self, state: Mapping[str, Any], runtime: Runtime[Any]
    ) -> Runnable[Any, BaseMessage]:
        session = run_session(runtime)
        node = self.node
        self._withholding = True
        messages = node.model_input(state)
        offered = node.search_tool is None or node.keeper.search_offered(session, messages)
        model = node.work_model(messages, search=offered)

        def in_view(rendered: Any) -> list[BaseMessage]:
            return composed_input(rendered, state)

        viewed = RunnableLambda(in_view, name="keeper_view") | model
        if offered:
            return viewed

        def answer_only(reply: BaseMessage) -> AIMessage:
            return node.keeper.answer_only(session, as_ai_message(reply))

        return viewed | RunnableLambda(answer_only, name="keeper_answer_only")

    @property
    def after_model(self) -> Runnable[Any, dict[str, Any]]:
        """A ``post_model_hook`` for an agent given a model of its own (the model itself, or a
        dynamic model) rather than :attr:`model`: ``create_react_agent`` binds such a model to
        every tool at every call, so the search tool cannot be withheld after the stop line;
        this drops the search calls of a reply made after it instead, and the run ends with the
        reply's answer rather than at LangGraph's recursion limit."""
        return RunnableLambda(self._after_model, afunc=self._aafter_model, name="keeper_after")

    def _after_model(self, state: Mapping[str, Any], config: RunnableConfig) -> dict[str, Any]:
        session = session_of(config)
        node = self.node
        self._withholding = True
        messages = list(state.get("messages", []))
        if not messages or not isinstance(messages[-1], AIMessage):
            return {}
        if node.search_tool is None or node.keeper.search_offered(session, messages):
            return {}
        reply = messages[-1]
        kept = node.keeper.answer_only(session, reply)
        # the same id: LangGraph's message reducer replaces the reply in place
        return {} if kept is reply else {"messages": [kept]}

    async def _aafter_model(
        self, state: Mapping[str, Any], config: RunnableConfig
    ) -> dict[str, Any]:
        return await asyncio.to_thread(self._after_model, state, config)

    @property
    def tools(self) -> list[Tool]:
        return list(self.node.tools)


def composed_input(rendered: Any, state: Mapping[str, Any]) -> list[BaseMessage]:
    """The agent's rendered input (its prompt's messages, then the state's) with the state's
    part replaced by the keeper's view of it (:func:`~keeper_middleware.state_view.model_view`).

    Args:
        rendered: what ``create_react_agent``'s prompt made: a list of messages or a prompt value.
        state: the agent's state after the keeper's hook ran.
    """
    messages = rendered.to_messages() if hasattr(rendered, "to_messages") else list(rendered)
    stored = {m.id for m in state.get("messages", []) if m.id}
    lead = next((i for i, m in enumerate(messages) if m.id in stored), len(messages))
    return [*messages[:lead], *model_view(messages[lead:], state.get(KEEPER_STATE_KEY))]


def keeper_pre_model_hook(
    model: BaseChatModel | str,
    *,
    tools: Sequence[Tool] = (),
    system_prompt: str | None = None,
    keeper: Keeper | KeeperConfig | None = None,
    config: KeeperConfig | None = None,
    archive: ArchiveStore | str | Path = ":memory:",
    retriever: RetrieverSpec = None,
    token_counter: TokenCounter | str | None = None,
    search: bool = True,
) -> KeeperPreModelHook:
    """The keeper for ``create_react_agent(hook.model, hook.tools, prompt=system_prompt,
    pre_model_hook=hook, state_schema=KeeperReactState)``.

    ``model``, ``tools`` and ``system_prompt`` must be the agent's own, so note calls render like
    its calls. ``hook.model`` is that model bound to ``hook.tools``: given to
    ``create_react_agent``, it withholds the search tool after the stop line, as every other
    entry point does. An agent given a model of its own instead (the model itself, or a dynamic
    model) is offered the tool at every call: pass ``post_model_hook=hook.after_model`` too, and
    a reply's search calls after the stop line are dropped (without either, a model that never
    stops searching runs on to LangGraph's recursion limit, and the keeper logs a warning naming
    these two). The hook runs before the model only: the thinking kwargs, the retry of a reply
    that thought to its limit and the stripping of reasoning from stored replies need the
    middleware (``create_agent``) or ``KeeperNode.model_runnable`` in a graph of your own.
    ``search=False`` adds no search tool; ``hook.keeper`` is the engine.

    Args:
        model: the agent's chat model, or an ``init_chat_model`` string.
        tools: the agent's tools; the archive search tool is added beside them.
        system_prompt: the agent's system prompt (note calls render it the same way).
        keeper: an engine to share (its own settings then stand, so ``config``, ``archive``,
            ``retriever`` and ``token_counter`` stay unset), or a :class:`KeeperConfig`.
        config: the settings of a keeper made here.
        archive: where a keeper made here archives (a SQLite path, a ``postgresql://`` URL,
            an ``ArchiveStore`` or ``":memory:"``).
        retriever: the search backend of a keeper made here.
        token_counter: how a keeper made here counts tokens.
        search: ``False`` adds no archive search tool.

    Raises:
        ConfigurationError: ``keeper=`` given with the arguments that make a keeper, or a
            tool of the agent's named ``search_archive``.
    """
    engine = make_keeper(keeper, config, archive, retriever, token_counter)
    node = KeeperNode(
        engine,
        model=model,
        tools=tools,
        system_prompt=system_prompt,
        search=search,
    )
    return KeeperPreModelHook(node)
