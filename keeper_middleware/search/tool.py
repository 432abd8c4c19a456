"""The archive search as a LangChain tool bound to a keeper.

The session is the LangGraph thread (``configurable.thread_id``): one thread can never search
another's archive. Run by a ``ToolNode`` (``create_keeper_agent``, ``create_agent`` with the
middleware, ``create_react_agent``), the tool is given the graph state (``ToolRuntime``): it
searches the branch that state is on (its ``keeper`` channel names the branch's latest cut) and
takes the guards' state from that branch's messages, so time travel, replays and forks search
what their own branch archived. Called any other way it searches the session as of its latest
cut, with the session's own guards.
"""

import asyncio
from collections.abc import Mapping
from typing import Any

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import StructuredTool
from langgraph.prebuilt import ToolRuntime

from keeper_middleware.keeper import Keeper
from keeper_middleware.search.schema import (
    SEARCH_TOOL_DESCRIPTION,
    SEARCH_TOOL_NAME,
    SEARCH_TOOL_PARAMETERS,
)

DEFAULT_SESSION = "default"


def session_of(config: RunnableConfig | None) -> str:
    """The session a call belongs to: its thread id, or "default"."""
    configurable = (config or {}).get("configurable") or {}
    thread = configurable.get("thread_id")
    return str(thread) if thread is not None else DEFAULT_SESSION


def _answer(
    keeper: Keeper, runtime: ToolRuntime | None, config: RunnableConfig | None, args: Any
) -> tuple[str, dict[str, Any] | None]:
    state = getattr(runtime, "state", None)
    call_id = getattr(runtime, "tool_call_id", None)
    if isinstance(state, Mapping) and isinstance(call_id, str):
        session = session_of(getattr(runtime, "config", None) or config)
        return keeper.answer_search(session, args, state=state, call_id=call_id)
    return keeper.run_search_tool(session_of(config), args), None


def archive_search_tool(keeper: Keeper) -> StructuredTool:
    """A ``search_archive`` tool over ``keeper``'s archive: a search (``query``, ``from_item``,
    ``to_item``) or a read of an excerpted message (``read``, ``page``).

    The arguments are passed on as the model wrote them (the schema is plain JSON, so no
    validation error escapes into the graph): :meth:`Keeper.run_search_tool` checks each one
    and answers a bad one with a "Refused: …" text. The result's ``artifact`` carries the
    guards' state after the search, for the next one on the same branch.

    Args:
        keeper: the keeper whose archive the tool searches; the session is the graph's thread.

    Returns:
        A LangChain tool named ``search_archive``, sync and async.
    """

    def search_archive(
        runtime: ToolRuntime | None = None, config: RunnableConfig | None = None, **args: Any
    ) -> tuple[str, dict[str, Any] | None]:
        return _answer(keeper, runtime, config, args)

    async def asearch_archive(
        runtime: ToolRuntime | None = None, config: RunnableConfig | None = None, **args: Any
    ) -> tuple[str, dict[str, Any] | None]:
        return await asyncio.to_thread(_answer, keeper, runtime, config, args)

    return StructuredTool(
        name=SEARCH_TOOL_NAME,
        description=SEARCH_TOOL_DESCRIPTION,
        args_schema=SEARCH_TOOL_PARAMETERS,
        func=search_archive,
        coroutine=asearch_archive,
        response_format="content_and_artifact",
    )
