"""The archive search as a LangChain tool bound to a keeper.

The session is the LangGraph thread (``configurable.thread_id``): one thread can never search
another's archive.
"""

import asyncio

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import StructuredTool

from keeper_middleware.keeper import Keeper
from keeper_middleware.search import SEARCH_TOOL_DESCRIPTION, SEARCH_TOOL_NAME

DEFAULT_SESSION = "default"


def session_of(config: RunnableConfig | None) -> str:
    """The session a call belongs to: its thread id, or "default"."""
    configurable = (config or {}).get("configurable") or {}
    thread = configurable.get("thread_id")
    return str(thread) if thread is not None else DEFAULT_SESSION


def archive_search_tool(keeper: Keeper) -> StructuredTool:
    """A ``search_archive(query, from_item=None, to_item=None)`` tool over ``keeper``'s archive."""

    def search_archive(
        query: str,
        config: RunnableConfig,
        from_item: int | None = None,
        to_item: int | None = None,
    ) -> str:
        return keeper.search(session_of(config), query, from_item, to_item)

    async def asearch_archive(
        query: str,
        config: RunnableConfig,
        from_item: int | None = None,
        to_item: int | None = None,
    ) -> str:
        return await asyncio.to_thread(keeper.search, session_of(config), query, from_item, to_item)

    return StructuredTool.from_function(
        func=search_archive,
        coroutine=asearch_archive,
        name=SEARCH_TOOL_NAME,
        description=SEARCH_TOOL_DESCRIPTION,
    )
