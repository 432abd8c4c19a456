"""A ready agent: keeper → model → tools, with the archive search tool bound."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Checkpointer

from keeper_middleware.archive.store import ArchiveStore
from keeper_middleware.config import KeeperConfig
from keeper_middleware.errors import ConfigurationError
from keeper_middleware.keeper import Keeper, Tool
from keeper_middleware.node import KeeperGraphState, KeeperNode, ToolChoice
from keeper_middleware.retrievers.factory import RetrieverSpec
from keeper_middleware.tokens.counting import TokenCounter


def make_keeper(
    keeper: Keeper | KeeperConfig | None,
    config: KeeperConfig | None,
    archive: ArchiveStore | str | Path,
    retriever: RetrieverSpec,
    token_counter: TokenCounter | str | None,
) -> Keeper:
    """The given keeper, or one made from its arguments; both at once is a mistake, since the
    given keeper's own settings would silently win. A :class:`KeeperConfig` given as ``keeper``
    is the config of a keeper made here: every entry point takes ``keeper=Keeper(...)`` or
    ``keeper=KeeperConfig(...)`` alike."""
    if isinstance(keeper, KeeperConfig):
        if config is not None:
            raise ConfigurationError(
                "keeper= is a KeeperConfig and config= was given too: pass one of them"
            )
        keeper, config = None, keeper
    if keeper is None:
        return Keeper(config, archive=archive, retriever=retriever, token_counter=token_counter)
    if not isinstance(keeper, Keeper):
        raise ConfigurationError(f"keeper={keeper!r} is a {type(keeper).__name__}; give a Keeper")
    given = {
        "config": config is not None,
        "archive": not (isinstance(archive, str) and archive == ":memory:"),
        "retriever": retriever is not None,
        "token_counter": token_counter is not None,
    }
    clashing = [name for name, set_ in given.items() if set_]
    if clashing:
        raise ConfigurationError(
            f"keeper= was given together with {', '.join(clashing)}=, which only make a new "
            "keeper: set them on the Keeper you pass (Keeper(config, archive=...)), or drop keeper="
        )
    return keeper


def create_keeper_agent(
    model: BaseChatModel | str,
    tools: Sequence[Tool] = (),
    *,
    system_prompt: str | None = None,
    config: KeeperConfig | None = None,
    keeper: Keeper | KeeperConfig | None = None,
    archive: ArchiveStore | str | Path = ":memory:",
    retriever: RetrieverSpec = None,
    token_counter: TokenCounter | str | None = None,
    checkpointer: Checkpointer = None,
    name: str | None = None,
    tool_choice: ToolChoice | None = None,
    search: bool = True,
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """A compiled tool-calling agent whose context the keeper manages.

    The keeper runs before every model call; the session is the thread id of each run
    (``config={"configurable": {"thread_id": ...}}``). Pass ``keeper=`` to share one engine
    (and archive) between graphs, or the keeper's own arguments to make one. ``tool_choice``
    applies to work calls only (see :data:`~keeper_middleware.node.ToolChoice`). ``model`` may be
    an ``init_chat_model`` string (``"openai:gpt-4o"``); ``search=False`` runs without the archive
    search tool (for a model or server without tool calling).

    The engine stays reachable as ``agent.keeper`` (counters, NOTES, archive search per thread).

    Args:
        model: the chat model, or an ``init_chat_model`` string.
        tools: the agent's tools; the archive search tool is added to them.
        system_prompt: the agent's system prompt.
        config: the keeper's settings, for a keeper made here (not with ``keeper=``).
        keeper: an engine to share between graphs (its own settings then stand, so ``config``,
            ``archive``, ``retriever`` and ``token_counter`` must be left unset), or a
            :class:`KeeperConfig` for a keeper made here.
        archive: where a keeper made here archives: a SQLite path, a ``postgresql://`` URL, an
            :class:`ArchiveStore`, or ``":memory:"``.
        retriever: the search backend of a keeper made here (see :class:`Keeper`).
        token_counter: how a keeper made here counts tokens (see :class:`Keeper`).
        checkpointer: the graph's checkpointer; pair a file archive with a persistent one.
        name: the compiled graph's name.
        tool_choice: the work calls' tool choice; note calls never force a tool.
        search: ``False`` runs without the archive search tool.

    Raises:
        ConfigurationError: ``keeper=`` given together with the arguments that make a keeper,
            a ``keeper`` that is not a :class:`Keeper`, or a tool named ``search_archive``.
    """
    engine = make_keeper(keeper, config, archive, retriever, token_counter)
    node = KeeperNode(
        engine,
        model=model,
        tools=tools,
        system_prompt=system_prompt,
        tool_choice=tool_choice,
        search=search,
    )
    graph = StateGraph(KeeperGraphState)
    graph.add_node("keeper", node.as_runnable("keeper"))
    graph.add_node("model", node.model_runnable("model"))
    runnable = [t for t in node.tools if not isinstance(t, dict)]  # schemas alone cannot run
    graph.add_edge(START, "keeper")
    graph.add_edge("keeper", "model")
    if node.tools:
        graph.add_node("tools", ToolNode(runnable))
        graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
        graph.add_edge("tools", "keeper")
    else:
        graph.add_edge("model", END)
    agent = graph.compile(checkpointer=checkpointer, name=name or "keeper_agent")
    agent.keeper = engine  # type: ignore[attr-defined]
    return agent
