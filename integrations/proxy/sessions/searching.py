"""The model's archive searches, answered inside the proxy: no argument the model writes can
fail the request. Each one is checked; a bad one, and any error the search meets, is answered
with a "Refused: …" tool result the model can read and correct."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from keeper_middleware.integrations.proxy.sessions.turns import new_id
from keeper_middleware.keeper import Keeper
from keeper_middleware.search.args import (
    MAX_ITEM,
    MAX_QUERY_CHARS,
    ReadArgs,
    Refusal,
    SearchArgs,
    parse_search_args,
)
from keeper_middleware.search.schema import SEARCH_TOOL_NAME

__all__ = ["MAX_ITEM", "MAX_QUERY_CHARS", "answer_searches", "run_search", "search_arguments"]

_log = logging.getLogger(__name__)


def search_arguments(args: Mapping[str, Any]) -> SearchArgs | ReadArgs | str:
    """The model's arguments as the core reads them (a search or a read), or the refusal."""
    parsed = parse_search_args(args)
    return parsed.text if isinstance(parsed, Refusal) else parsed


def run_search(keeper: Keeper, session: str, args: Mapping[str, Any]) -> str:
    """The search's result text, or a refusal; never an exception."""
    try:
        return keeper.run_search_tool(session, args)
    except Exception as exc:  # the model must get an answer it can act on, not a 500
        _log.warning("archive search failed on %s: %r", session, exc)
        return f"Refused: the search could not run ({type(exc).__name__}); try other keywords."


def answer_searches(keeper: Keeper, session: str, reply: AIMessage) -> list[BaseMessage]:
    """The model's searches answered by the proxy: the call (searches only) and its results.
    Nothing the model sends can make this fail: bad arguments get a "Refused: …" result."""
    calls = [c for c in reply.tool_calls if c["name"] == SEARCH_TOOL_NAME]
    broken = [c for c in reply.invalid_tool_calls if c["name"] == SEARCH_TOOL_NAME]
    asked = reply.model_copy(update={"tool_calls": calls, "invalid_tool_calls": broken})
    results: list[BaseMessage] = [asked]
    for call in calls:
        results.append(_search_result(call["id"], run_search(keeper, session, call["args"])))
    for bad in broken:
        text = 'Refused: the arguments were not a JSON object like {"query": "a name"}.'
        results.append(_search_result(bad["id"], text))
    return results


def _search_result(call_id: str | None, text: str) -> ToolMessage:
    return ToolMessage(content=text, tool_call_id=call_id or "", name=SEARCH_TOOL_NAME, id=new_id())
