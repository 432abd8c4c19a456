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
from typing import Annotated, Any, NotRequired, cast

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.config import get_config
from langgraph.runtime import Runtime

from keeper_middleware.agent import make_keeper
from keeper_middleware.archive.store import ArchiveStore
from keeper_middleware.config import KeeperConfig, StateMessages
from keeper_middleware.errors import MissingDependencyError
from keeper_middleware.integrations.react_hook import (
    KeeperPreModelHook,
    KeeperReactState,
    keeper_pre_model_hook,
    run_session,
)
from keeper_middleware.keeper import Keeper, ModelSetup, Tool
from keeper_middleware.messages.facts import as_ai_message
from keeper_middleware.model.calls import (
    bind_tools_clearly,
    internal_call_config,
    resolve_chat_model,
    tool_refusal,
)
from keeper_middleware.node import (
    checked_tools,
    forces_search,
    state_update,
    tool_name,
)
from keeper_middleware.retrievers.factory import RetrieverSpec
from keeper_middleware.search.schema import SEARCH_TOOL_NAME
from keeper_middleware.search.tool import archive_search_tool
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
            run_session(runtime), given, engine_state(kstate), self._setup, self._call
        )
        return state_update(stored, given, result, self._mode())

    async def abefore_model(self, state: KeeperAgentState, runtime: Runtime[Any]) -> dict[str, Any]:
        stored = list(state["messages"])
        kstate = state.get(KEEPER_STATE_KEY)
        given = model_view(stored, kstate)
        result = await self.keeper.astep(
            run_session(runtime), given, engine_state(kstate), self._setup, self._acall
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
        session = run_session(request.runtime)
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
        session = run_session(request.runtime)
        first, offered = await asyncio.to_thread(self._first_request, request, session)
        with self._explained(bool(first.tools)):
            response = self._answers_only(await handler(first), session, offered)
            again = self._retry(first, response, session)
            if again is not None:
                response = self._answers_only(await handler(again), session, offered)
        return await asyncio.to_thread(self._recorded, response, session)
