"""The keeper inside LangChain agents: middleware for ``create_agent`` and a ``pre_model_hook``
for LangGraph's ``create_react_agent``.

Both only convert formats; the decisions are the engine's (:class:`~keeper_middleware.Keeper`),
exactly as in :class:`~keeper_middleware.KeeperNode`.

How :class:`KeeperMiddleware` splits the work between the hooks:

- ``before_model`` runs one keeper step on the stored history. New questions get the RULES block
  written right after them, once: it stays byte-identical in every later request while it is in
  view, so the server's prefix cache keeps serving it (docs/formats.md §3). When the window is
  about to fill, the note call is made here and the step's update rewrites the history
  (``RemoveMessage(REMOVE_ALL_MESSAGES)`` and the new window): the checkpoint really shrinks and
  the archive holds every turn that left.
- ``wrap_model_call`` changes only the request: the thinking kwargs (``model_settings``), one
  retry without thinking of a reply that thought to its limit and wrote nothing, and the reply's
  reasoning stripped before it is stored.

The note call must render exactly like the agent's own call (same system prompt, same tools) or
it misses the prefix cache. ``before_model`` has no ``ModelRequest``, so the middleware renders it
from what the latest ``wrap_model_call`` request of this middleware carried (model, system
message, tools, including tools that other middleware added). Until the first request of the
process has been seen (a fresh agent, or a thread resumed after a restart), it uses the model,
tools and system prompt given to the constructor, with the archive search tool first, as
``create_agent`` orders middleware tools before the agent's own. Pass it the same ones you pass
``create_agent``.

Order among other middleware: hooks run in list order, and the first listed ``wrap_model_call``
is the outermost. List the keeper after any middleware that changes the request (a dynamic system
prompt, tool selection) so that it learns the request the model really receives. Note calls are
made from ``before_model`` and so do not pass through other middleware's ``wrap_model_call``
(``ModelRetryMiddleware``, fallbacks): give the chat model its own retries (``max_retries`` on
``ChatOpenAI``). Do not combine the keeper with ``SummarizationMiddleware``: both rewrite the
history. ``ToolCallLimitMiddleware``, ``ToolRetryMiddleware`` and ``HumanInTheLoopMiddleware``
work in any order; their own state survives cuts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NotRequired, TypedDict, cast

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda
from langchain_core.tools import BaseTool
from langgraph.config import get_config
from langgraph.graph.message import add_messages
from langgraph.managed import RemainingSteps
from langgraph.runtime import Runtime

from keeper_middleware.agent import make_keeper
from keeper_middleware.archive.store import ArchiveStore
from keeper_middleware.config import KeeperConfig, StateMessages
from keeper_middleware.errors import MissingDependencyError
from keeper_middleware.keeper import Keeper, ModelSetup, Tool
from keeper_middleware.messages.facts import as_ai_message
from keeper_middleware.model.calls import (
    bind_tools_clearly,
    internal_call_config,
    resolve_chat_model,
    tool_refusal,
)
from keeper_middleware.node import (
    KeeperNode,
    checked_tools,
    forces_search,
    state_update,
    tool_name,
)
from keeper_middleware.retrievers.factory import RetrieverSpec
from keeper_middleware.search.schema import SEARCH_TOOL_NAME
from keeper_middleware.search.tool import DEFAULT_SESSION, archive_search_tool, session_of
from keeper_middleware.state_view import (
    KEEPER_STATE_KEY,
    effective_mode,
    engine_state,
    model_view,
)
from keeper_middleware.tokens.counting import TokenCounter

log = logging.getLogger(__name__)

try:
    from langchain.agents.middleware import (
        AgentMiddleware,
        AgentState,
        ModelRequest,
        ModelResponse,
    )
    from langchain.agents.middleware.types import OmitFromOutput
except ImportError as exc:  # the middleware needs LangChain v1; the rest of the keeper does not
    raise MissingDependencyError("langchain", "langchain") from exc

__all__ = [
    "KeeperAgentState",
    "KeeperMiddleware",
    "KeeperPreModelHook",
    "KeeperReactState",
    "keeper_pre_model_hook",
]


class KeeperAgentState(AgentState[Any]):
    """The agent state with the keeper's bookkeeping: plain dicts and lists, so checkpointers
    serialise it as they are. Never agent output, but accepted as input: a thread copied with
    ``update_state(new_thread, get_state(thread).values)`` on a new thread writes through the
    graph's input, and the keeper's channel must go with it, as the NOTES in view no longer do
    (they live in this channel: ``KeeperConfig.state_messages``), or the copy starts with no
    memory (:mod:`keeper_middleware.sessions.copies`)."""

    keeper: NotRequired[Annotated[dict[str, Any], OmitFromOutput]]


class KeeperReactState(TypedDict):
    """``create_react_agent``'s state plus the keeper's bookkeeping (pass it as
    ``state_schema``: a hook's update to a key the schema lacks is silently dropped)."""

    messages: Annotated[Sequence[AnyMessage], add_messages]
    remaining_steps: NotRequired[RemainingSteps]
    keeper: NotRequired[dict[str, Any]]


def _session(runtime: Runtime[Any] | None) -> str:
    """The thread id of the run (the session the archive is kept under), else "default"."""
    info = getattr(runtime, "execution_info", None)
    thread = getattr(info, "thread_id", None)
    if thread is not None:
        return str(thread)
    try:
        return session_of(get_config())
    except RuntimeError:  # called outside a graph run (a hand-built request in a test)
        return DEFAULT_SESSION


def _first_ai(response: ModelResponse[Any]) -> AIMessage | None:
    return next((m for m in response.result if isinstance(m, AIMessage)), None)


class KeeperMiddleware(AgentMiddleware[KeeperAgentState, Any, Any]):
    """The keeper as ``create_agent`` middleware (see the module docstring for the design).

    ``model``, ``tools`` and ``system_prompt`` are what you pass ``create_agent``; they render
    the note calls until the first model request shows the exact rendering. The archive search
    tool is added to the agent through ``self.tools``. The session is the run's thread id.
    ``model`` may be an ``init_chat_model`` string; ``search=False`` adds no tool (for a model or
    server without tool calling). ``self.keeper`` is the engine (counters, NOTES, archive search).

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

    state_schema = KeeperAgentState

    def __init__(
        self,
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
    ) -> None:
        super().__init__()
        self.keeper = make_keeper(keeper, config, archive, retriever, token_counter)
        self.search_tool = archive_search_tool(self.keeper) if search else None
        self.tools: Sequence[BaseTool] = [self.search_tool] if self.search_tool else []
        self._model = resolve_chat_model(model)
        user_tools = checked_tools(tools, self.search_tool)
        if self.search_tool is not None:  # create_agent puts middleware tools first
            user_tools = (self.search_tool, *user_tools[:-1])
        self._setup = ModelSetup(system_prompt=system_prompt, tools=user_tools)
        self._bound: tuple[BaseChatModel, ModelSetup, Runnable[Any, BaseMessage]] | None = None
        self.state_messages: StateMessages = self.keeper.config.state_messages or "window"
        """What ``state["messages"]`` holds (``KeeperConfig.state_messages``; here
        ``"window"`` by default: ``wrap_model_call`` adds the keeper's messages to the request)."""

    @property
    def setup(self) -> ModelSetup:
        """How note calls are rendered now (the latest request's system prompt and tools)."""
        return self._setup

    # ---- before_model: the keeper step on the stored history

    def before_model(self, state: KeeperAgentState, runtime: Runtime[Any]) -> dict[str, Any]:
        stored = list(state["messages"])
        kstate = state.get(KEEPER_STATE_KEY)
        given = model_view(stored, kstate)
        result = self.keeper.step(
            _session(runtime), given, engine_state(kstate), self._setup, self._call
        )
        return state_update(stored, given, result, self._mode())

    async def abefore_model(self, state: KeeperAgentState, runtime: Runtime[Any]) -> dict[str, Any]:
        stored = list(state["messages"])
        kstate = state.get(KEEPER_STATE_KEY)
        given = model_view(stored, kstate)
        result = await self.keeper.astep(
            _session(runtime), given, engine_state(kstate), self._setup, self._acall
        )
        return state_update(stored, given, result, self._mode())

    def _mode(self) -> StateMessages:
        try:
            config: RunnableConfig | None = get_config()
        except RuntimeError:  # called outside a graph run
            config = None
        return effective_mode(self.state_messages, config)

    def _note_model(self) -> Runnable[Any, BaseMessage]:
        bound = self._bound
        if bound is None or bound[0] is not self._model or bound[1] != self._setup:
            runnable = bind_tools_clearly(self._model, self._setup.tools)
            bound = (self._model, self._setup, runnable)
            self._bound = bound
        return bound[2]

    def _call(self, messages: list[BaseMessage], kwargs: Mapping[str, Any]) -> AIMessage:
        with self._explained(bool(self._setup.tools)):
            reply = self._note_model().invoke(messages, internal_call_config(), **kwargs)
        return as_ai_message(reply)

    async def _acall(self, messages: list[BaseMessage], kwargs: Mapping[str, Any]) -> AIMessage:
        with self._explained(bool(self._setup.tools)):
            reply = await self._note_model().ainvoke(messages, internal_call_config(), **kwargs)
        return as_ai_message(reply)

    @staticmethod
    @contextmanager
    def _explained(tools_sent: bool) -> Iterator[None]:
        """A server that refuses tools gets an error naming ``search=False``."""
        try:
            yield
        except Exception as exc:
            clear = tool_refusal(exc, tools_sent=tools_sent)
            if clear is None:
                raise
            raise clear from exc

    # ---- wrap_model_call: request-only changes around the agent's own call

    def _learn(self, request: ModelRequest[Any]) -> None:
        """Render later note calls like this request (it is what the model really receives)."""
        setup = ModelSetup(system_prompt=request.system_prompt, tools=tuple(request.tools))
        if setup != self._setup:
            self._setup = setup
        self._model = request.model

    def _first_request(
        self, request: ModelRequest[Any], session: str
    ) -> tuple[ModelRequest[Any], bool]:
        """The request as sent (the keeper's messages in place, thinking kwargs; after the stop
        line, no search tool), and whether the search tool is offered in it."""
        self._learn(request)
        view = model_view(request.messages, (request.state or {}).get(KEEPER_STATE_KEY))
        if view != request.messages:
            request = request.override(messages=cast("list[AnyMessage]", view))
        kwargs = self.keeper.work_kwargs(session, request.messages)
        if kwargs:
            request = request.override(model_settings={**request.model_settings, **kwargs})
        offered = self.search_tool is None or self.keeper.search_offered(session, request.messages)
        if not offered:
            tools = [t for t in request.tools if tool_name(t) != SEARCH_TOOL_NAME]
            choice = request.tool_choice
            if forces_search(choice) or not tools:
                choice = None
            request = request.override(tools=tools, tool_choice=choice)
        return request, offered

    def _answers_only(
        self, response: ModelResponse[Any], session: str, offered: bool
    ) -> ModelResponse[Any]:
        """The response without search calls, when its request was not offered the tool."""
        reply = _first_ai(response)
        if offered or reply is None:
            return response
        kept = self.keeper.answer_only(session, reply)
        if kept is reply:
            return response
        result = [kept if m is reply else m for m in response.result]
        return ModelResponse(result=result, structured_response=response.structured_response)

    def _retry(
        self, first: ModelRequest[Any], response: ModelResponse[Any], session: str
    ) -> ModelRequest[Any] | None:
        """The request to send again, when the keeper's retry policy says so."""
        reply = _first_ai(response)
        if reply is None:
            return None
        settings = self.keeper.retry_kwargs(session, first.model_settings, reply)
        return None if settings is None else first.override(model_settings=settings)

    def _recorded(self, response: ModelResponse[Any], session: str) -> ModelResponse[Any]:
        """The response with its reply counted and its reasoning stripped."""
        reply = _first_ai(response)
        if reply is None:
            return response
        kept = self.keeper.record_reply(session, reply)
        result = [kept if m is reply else m for m in response.result]
        return ModelResponse(result=result, structured_response=response.structured_response)

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any]:
        session = _session(request.runtime)
        first, offered = self._first_request(request, session)
        with self._explained(bool(first.tools)):
            response = self._answers_only(handler(first), session, offered)
            again = self._retry(first, response, session)
            if again is not None:
                response = self._answers_only(handler(again), session, offered)
        return self._recorded(response, session)

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        session = _session(request.runtime)
        first, offered = await asyncio.to_thread(self._first_request, request, session)
        with self._explained(bool(first.tools)):
            response = self._answers_only(await handler(first), session, offered)
            again = self._retry(first, response, session)
            if again is not None:
                response = self._answers_only(await handler(again), session, offered)
        return await asyncio.to_thread(self._recorded, response, session)


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
        session = _session(runtime)
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
