"""The archive search as a LangChain tool bound to a keeper.

The session is the LangGraph thread (``configurable.thread_id``): one thread can never search
another's archive.
"""

import asyncio
from typing import Any

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import StructuredTool

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


def archive_search_tool(keeper: Keeper) -> StructuredTool:
    """A ``search_archive`` tool over ``keeper``'s archive: a search (``query``, ``from_item``,
    ``to_item``) or a read of an excerpted message (``read``, ``page``).

    The arguments are passed on as the model wrote them (the schema is plain JSON, so no
    validation error escapes into the graph): :meth:`Keeper.run_search_tool` checks each one
    and answers a bad one with a "Refused: …" text.

    Args:
        keeper: the keeper whose archive the tool searches; the session is the graph's thread.

    Returns:
        A LangChain tool named ``search_archive``, sync and async.
    """

    def search_archive(config: RunnableConfig, **args: Any) -> str:
        return keeper.run_search_tool(session_of(config), args)

    async def asearch_archive(config: RunnableConfig, **args: Any) -> str:
        return await asyncio.to_thread(keeper.run_search_tool, session_of(config), args)

    return StructuredTool(
        name=SEARCH_TOOL_NAME,
        description=SEARCH_TOOL_DESCRIPTION,
        args_schema=SEARCH_TOOL_PARAMETERS,
        func=search_archive,
        coroutine=asearch_archive,
    )
