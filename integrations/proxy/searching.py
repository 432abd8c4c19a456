"""The model's archive searches, answered inside the proxy: no argument the model writes can
fail the request. Each one is checked; a bad one, and any error the search meets, is answered
with a "Refused: …" tool result the model can read and correct."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from keeper_middleware.keeper import Keeper

__all__ = ["MAX_ITEM", "MAX_QUERY_CHARS", "run_search", "search_arguments"]

MAX_ITEM = 2**53
"""Item bounds beyond this are not item numbers (and overflow SQLite's integers)."""
MAX_QUERY_CHARS = 2000
_log = logging.getLogger(__name__)


def _item(args: Mapping[str, Any], name: str) -> int | str | None:
    """An item bound as an int, None when absent, or the refusal text."""
    value = args.get(name)
    if value is None or value == "":
        return None
    if isinstance(value, str) and value.strip().lstrip("-").isdigit() and len(value) < 20:
        value = int(value.strip())
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        return f"Refused: {name} must be a whole item number, got {str(value)[:40]!r}."
    if not 0 <= value <= MAX_ITEM:
        return (
            f"Refused: {name} must be an item number from 0 to {MAX_ITEM}, got {str(value)[:40]}."
        )
    return value


def search_arguments(args: Mapping[str, Any]) -> tuple[str, int | None, int | None] | str:
    """(query, from_item, to_item) from the model's arguments, or the refusal to give it."""
    query = args.get("query")
    if not isinstance(query, str) or not query.strip():
        return "Refused: give a few keywords to search for in 'query' (for example a name)."
    if len(query) > MAX_QUERY_CHARS:
        return f"Refused: 'query' is {len(query)} characters; search with a few keywords."
    low, high = _item(args, "from_item"), _item(args, "to_item")
    if isinstance(low, str):
        return low
    if isinstance(high, str):
        return high
    if low is not None and high is not None and low > high:
        return f"Refused: from_item {low} is after to_item {high}; swap them."
    return query, low, high


def run_search(keeper: Keeper, session: str, args: Mapping[str, Any]) -> str:
    """The search's result text, or a refusal; never an exception."""
    checked = search_arguments(args)
    if isinstance(checked, str):
        return checked
    query, low, high = checked
    try:
        return keeper.search(session, query, low, high)
    except Exception as exc:  # the model must get an answer it can act on, not a 500
        _log.warning("archive search failed on %s: %r", session, exc)
        return f"Refused: the search could not run ({type(exc).__name__}); try other keywords."
