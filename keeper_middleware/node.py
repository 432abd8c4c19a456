"""The keeper as a LangGraph node, placed before every model node of a graph.

The node converts between graph state and the engine: it reads ``messages`` and the keeper's
JSON-like bookkeeping (``keeper``), runs one step, and returns an update. A cut rewrites the stored
history (``RemoveMessage(REMOVE_ALL_MESSAGES)`` plus the new window), so checkpoints really shrink;
everything that left is in the archive.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Annotated, Any, NotRequired, TypedDict

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda
from langgraph.graph.message import add_messages

from keeper_middleware.config import KeeperConfig, StateMessages
from keeper_middleware.errors import ConfigurationError
from keeper_middleware.keeper import Keeper, ModelSetup, StepResult, Tool
from keeper_middleware.messages.facts import as_ai_message
from keeper_middleware.model.calls import (
    bind_tools_clearly,
    internal_call_config,
    resolve_chat_model,
    tool_refusal,
)
from keeper_middleware.search.schema import SEARCH_TOOL_NAME
from keeper_middleware.search.tool import archive_search_tool, session_of
from keeper_middleware.state_view import (
    KEEPER_STATE_KEY,
    effective_mode,
    engine_state,
    model_view,
    view_update,
)

__all__ = ["KEEPER_STATE_KEY", "KeeperGraphState", "KeeperNode", "keeper_node"]

ToolChoice = str | dict[str, Any] | Callable[[Sequence[BaseMessage]], str | dict[str, Any] | None]
"""A tool choice for work calls, fixed or decided per call from the messages (None: free).
Forcing a tool on every call makes an agent loop: decide per call, e.g. only after user input."""


class KeeperGraphState(TypedDict):
    """The state a keeper graph needs: the messages and the keeper's own bookkeeping."""

    messages: Annotated[list[AnyMessage], add_messages]
    keeper: NotRequired[dict[str, Any]]


def state_update(
    stored: Sequence[BaseMessage],
    given: Sequence[BaseMessage],
    result: StepResult,
    mode: StateMessages,
) -> dict[str, Any]:
    """The graph update for a step: the keeper's channel, and the messages as ``mode`` keeps
    them (:func:`~keeper_middleware.state_view.view_update`)."""
    return view_update(stored, given, result, mode)


class KeeperNode:
    """Runs the keeper before a model call; usable as a node of any ``StateGraph``.

    ``model``, ``tools`` and ``system_prompt`` must be what the model node uses: note-taking
    calls are rendered exactly like work calls, so they hit the server's prefix cache. The archive
    search tool is added to ``tools`` (``node.tools``); bind the same list in the model node.
    ``model`` may be an ``init_chat_model`` string; ``search=False`` leaves the search tool out
    (for a model or server without tool calling). Note calls stay out of user-facing streams and
    callbacks (see :mod:`keeper_middleware.model.calls`).

    Where the keeper's own messages (NOTES, RULES) go is ``KeeperConfig.state_messages``
    (:mod:`keeper_middleware.state_view`). A model node of your own reads ``state["messages"]``,
    so by default they are written there, marked; with :meth:`model_runnable` as the model node,
    or ``model_reads_view=True`` (your model node calls :meth:`model_input`), they stay in the
    keeper's channel and only the model is sent them.

    Args:
        keeper: the engine that keeps this graph's memory (one may serve many graphs), or a
            :class:`KeeperConfig` for a keeper of its own (archive in memory).
        model: the chat model the model node calls, or an ``init_chat_model`` string.
        tools: the tools the model node binds; the archive search tool is added to them.
        system_prompt: the model node's system prompt (note calls render it the same way).
        tool_choice: the work calls' tool choice; note calls never force a tool.
        search: ``False`` leaves the archive search tool out.
        model_reads_view: the model node composes its input with :meth:`model_input`; the
            keeper's messages then stay out of ``state["messages"]`` unless
            ``KeeperConfig.state_messages`` says otherwise.

    Raises:
        ConfigurationError: ``keeper`` is neither a :class:`Keeper` nor a config, ``tools`` is not a list, or
            one of them is already named ``search_archive`` (rename it, or ``search=False``).
    """

    def __init__(
        self,
        keeper: Keeper | KeeperConfig,
        *,
        model: BaseChatModel | str,
        tools: Sequence[Tool] = (),
        system_prompt: str | None = None,
        tool_choice: ToolChoice | None = None,
        search: bool = True,
        model_reads_view: bool = False,
    ) -> None:
        if isinstance(keeper, KeeperConfig):
            keeper = Keeper(keeper)
        if not isinstance(keeper, Keeper):
            raise ConfigurationError(
                f"keeper={keeper!r} is a {type(keeper).__name__}; give a Keeper(...) or a "
                "KeeperConfig(...)"
            )
        chat_model = resolve_chat_model(model)
        self.keeper = keeper
        self.search_tool = archive_search_tool(keeper) if search else None
        self.tools: tuple[Tool, ...] = checked_tools(tools, self.search_tool)
        self.setup = ModelSetup(system_prompt=system_prompt, tools=self.tools)
        self.model: Runnable[Any, BaseMessage] = bind_tools_clearly(chat_model, self.tools)
        self._raw_model = chat_model
        self._tool_choice = tool_choice
        self._forced: dict[str, Runnable[Any, BaseMessage]] = {}
        default: StateMessages = "window" if model_reads_view else "window_with_keeper"
        self.state_messages: StateMessages = keeper.config.state_messages or default
        """What ``state["messages"]`` holds (``KeeperConfig.state_messages``)."""

    def __call__(self, state: Mapping[str, Any], config: RunnableConfig) -> dict[str, Any]:
        session = session_of(config)
        stored = list(state.get("messages", []))
        kstate = state.get(KEEPER_STATE_KEY)
        given = model_view(stored, kstate)
        result = self.keeper.step(session, given, engine_state(kstate), self.setup, self._call)
        return state_update(stored, given, result, effective_mode(self.state_messages, config))

    async def acall(self, state: Mapping[str, Any], config: RunnableConfig) -> dict[str, Any]:
        session = session_of(config)
        stored = list(state.get("messages", []))
        kstate = state.get(KEEPER_STATE_KEY)
        given = model_view(stored, kstate)
        result = await self.keeper.astep(
            session, given, engine_state(kstate), self.setup, self._acall
        )
        return state_update(stored, given, result, effective_mode(self.state_messages, config))

    @staticmethod
    def model_input(state: Mapping[str, Any]) -> list[BaseMessage]:
        """The messages the model is sent after the keeper's step: ``state["messages"]`` with
        the keeper's NOTES and RULES put back where they stand (and, with
        ``state_messages="all"``, only the messages in view). A model node of your own calls it
        in place of reading ``state["messages"]``; with ``"window_with_keeper"`` it is them.

        Args:
            state: the graph state after the keeper's node ran.
        """
        return model_view(list(state.get("messages", [])), state.get(KEEPER_STATE_KEY))

    def as_runnable(self, name: str = "keeper") -> Runnable[Any, Any]:
        """The node with both sync and async paths, for ``graph.add_node(name, ...)``."""
        return RunnableLambda(self.__call__, afunc=self.acall, name=name)

    def _call(self, messages: list[BaseMessage], kwargs: Mapping[str, Any]) -> AIMessage:
        with self._explained():
            return as_ai_message(self.model.invoke(messages, internal_call_config(), **kwargs))

    async def _acall(self, messages: list[BaseMessage], kwargs: Mapping[str, Any]) -> AIMessage:
        with self._explained():
            reply = await self.model.ainvoke(messages, internal_call_config(), **kwargs)
            return as_ai_message(reply)

    @contextmanager
    def _explained(self) -> Iterator[None]:
        """A server that refuses tools gets an error naming ``search=False``."""
        try:
            yield
        except Exception as exc:
            clear = tool_refusal(exc, tools_sent=bool(self.tools))
            if clear is None:
                raise
            raise clear from exc

    # ---- the model node that goes with it (used by create_keeper_agent and the arms)

    def work_model(
        self, messages: Sequence[BaseMessage], *, search: bool = True
    ) -> Runnable[Any, BaseMessage]:
        """The model for a work call: bound to the tools, with the tool choice for this call;
        ``search=False`` leaves the search tool out (after the stop line).

        Note calls never get a forced tool choice: they must answer in change lines.
        """
        choice = self._tool_choice(messages) if callable(self._tool_choice) else self._tool_choice
        withheld = not search and self.search_tool is not None
        if choice is None and not withheld:
            return self.model
        if withheld and (forces_search(choice) or len(self.tools) == 1):
            choice = None  # no choice forces the withheld tool, or a tool list left empty
        key = f"{choice!r}|{withheld}"
        if key not in self._forced:
            tools = [t for t in self.tools if t is not self.search_tool] if withheld else self.tools
            # providers take a name or a {"type": "function", ...} dict; pass it on as given
            choice_kwargs: dict[str, Any] = {} if choice is None else {"tool_choice": choice}
            self._forced[key] = bind_tools_clearly(self._raw_model, tools, **choice_kwargs)
        return self._forced[key]

    def _reply(
        self, session: str, messages: Sequence[BaseMessage]
    ) -> tuple[Runnable[Any, BaseMessage], bool]:
        offered = self.search_tool is None or self.keeper.search_offered(session, messages)
        return self.work_model(messages, search=offered), offered

    def call_model(self, state: Mapping[str, Any], config: RunnableConfig) -> dict[str, Any]:
        """A model node that calls the model the way the keeper expects (sync)."""
        session = session_of(config)
        view = self.model_input(state)
        messages = self.setup.render(view)
        kwargs = self.keeper.work_kwargs(session, view)
        model, offered = self._reply(session, view)
        with self._explained():
            reply = self._answered(session, offered, model.invoke(messages, **kwargs))
            retry = self.keeper.retry_kwargs(session, kwargs, reply)
            if retry is not None:
                reply = self._answered(session, offered, model.invoke(messages, **retry))
        return {"messages": [self.keeper.record_reply(session, reply)]}

    def _answered(self, session: str, offered: bool, reply: BaseMessage) -> AIMessage:
        """The reply as an AIMessage; without search calls when the tool was withheld."""
        message = as_ai_message(reply)
        return message if offered else self.keeper.answer_only(session, message)

    async def acall_model(self, state: Mapping[str, Any], config: RunnableConfig) -> dict[str, Any]:
        """The same model node (async)."""
        session = session_of(config)
        view = self.model_input(state)
        messages = self.setup.render(view)
        kwargs = await asyncio.to_thread(self.keeper.work_kwargs, session, view)
        model, offered = await asyncio.to_thread(self._reply, session, view)
        with self._explained():
            reply = self._answered(session, offered, await model.ainvoke(messages, **kwargs))
            retry = self.keeper.retry_kwargs(session, kwargs, reply)
            if retry is not None:
                reply = self._answered(session, offered, await model.ainvoke(messages, **retry))
        recorded = await asyncio.to_thread(self.keeper.record_reply, session, reply)
        return {"messages": [recorded]}

    def model_runnable(self, name: str = "model") -> Runnable[Any, Any]:
        """The model node that goes with this keeper node (:meth:`call_model`). It composes
        the model's input (:meth:`model_input`), so taking it keeps the keeper's messages out
        of ``state["messages"]`` (``state_messages="window"``) unless the config says
        otherwise."""
        if self.keeper.config.state_messages is None:
            self.state_messages = "window"
        return RunnableLambda(self.call_model, afunc=self.acall_model, name=name)


def keeper_node(
    keeper: Keeper | KeeperConfig,
    *,
    model: BaseChatModel | str,
    tools: Sequence[Tool] = (),
    system_prompt: str | None = None,
    tool_choice: ToolChoice | None = None,
    search: bool = True,
) -> KeeperNode:
    """Build a :class:`KeeperNode`; add ``node.as_runnable()`` before your model node.

    Args:
        keeper: the engine that keeps this graph's memory (one may serve many graphs), or a
            :class:`KeeperConfig` for a keeper of its own (archive in memory).
        model: the chat model the model node calls, or an ``init_chat_model`` string.
        tools: the tools the model node binds; the archive search tool is added to them.
        system_prompt: the model node's system prompt (note calls render it the same way).
        tool_choice: the work calls' tool choice; note calls never force a tool.
        search: ``False`` leaves the archive search tool out.

    Raises:
        ConfigurationError: ``keeper`` is neither a :class:`Keeper` nor a config, ``tools`` is not a list, or
            one of them is already named ``search_archive`` (rename it, or ``search=False``).
    """
    return KeeperNode(
        keeper,
        model=model,
        tools=tools,
        system_prompt=system_prompt,
        tool_choice=tool_choice,
        search=search,
    )


def forces_search(choice: object) -> bool:
    """Whether a tool choice forces the search tool (by name, or OpenAI's function dict)."""
    if choice == SEARCH_TOOL_NAME:
        return True
    if isinstance(choice, dict):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else choice.get("name")
        return bool(name == SEARCH_TOOL_NAME)
    return False


def checked_tools(tools: Sequence[Tool], search_tool: Tool | None) -> tuple[Tool, ...]:
    """The user's tools plus the search tool (when on); a user tool under the search tool's
    name would shadow it, so it is refused."""
    if isinstance(tools, str | bytes) or not isinstance(tools, Sequence):
        raise ConfigurationError(f"tools={tools!r}; give a list of tools")
    if search_tool is not None:
        for tool in tools:
            if tool_name(tool) == SEARCH_TOOL_NAME:
                raise ConfigurationError(
                    f"a tool of yours is named {SEARCH_TOOL_NAME!r}, the keeper's archive search "
                    "tool: rename yours, or pass search=False to run without the keeper's"
                )
        return (*tools, search_tool)
    return tuple(tools)


def tool_name(tool: Tool) -> str | None:
    """A tool's name as a model would see it (object, function or OpenAI schema)."""
    if isinstance(tool, dict):
        function = tool.get("function")
        name = function.get("name") if isinstance(function, dict) else tool.get("name")
        return str(name) if name is not None else None
    name = getattr(tool, "name", None) or getattr(tool, "__name__", None)
    return str(name) if name is not None else None
