"""The archive search tool's arguments: one pure check shared by every entry point.

The model writes these arguments, so anything can arrive: a range backwards, ``2**70``, ``1e400``,
a string where a number belongs, a lone surrogate, a 100KB "query". Each of them once raised
inside the tool (ValueError, OverflowError, UnicodeEncodeError) and, with the run gone, left a
tool call without its result in the history. Here every argument is read once, and a bad one
becomes a ``Refused: …`` text the model can act on; nothing raises.

The LangChain tool, :meth:`~keeper_middleware.Keeper.search` and the proxy all go through
:func:`parse_search_args`, and publish the same JSON schema
(:data:`~keeper_middleware.search.schema.SEARCH_TOOL_PARAMETERS`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

MAX_QUERY_CHARS = 500
"""A search names a few keywords; a longer "query" is pasted text, and is refused."""
MAX_ITEM = 10**12
"""Item numbers beyond this are not item numbers (SQLite integers overflow at 2**63)."""
MAX_PAGE = 100_000
MAX_REF_CHARS = 200


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchArgs:
    """A search the archive can run as it is."""

    query: str
    from_item: int | None = None
    to_item: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadArgs:
    """A page of one archived message to show."""

    ref: str
    page: int = 1


@dataclass(frozen=True, slots=True)
class Refusal:
    """Arguments that cannot run; ``text`` is the tool's reply."""

    text: str


def refused(reason: str) -> Refusal:
    return Refusal(f"Refused: {reason}")


def parse_search_args(args: object) -> SearchArgs | ReadArgs | Refusal:
    """The model's arguments as a search, a read, or a refusal that says what to send instead."""
    if not isinstance(args, Mapping):
        return refused('the arguments must be an object like {"query": "a name"}.')
    read = args.get("read")
    if read is not None and read != "":
        return _read_args(read, args.get("page"))
    query = args.get("query")
    if query is None or (isinstance(query, str) and not query.strip()):
        return refused("give a few keywords to search for (for example a name).")
    if not isinstance(query, str):
        return refused(f"query must be text (a few keywords), not {_kind(query)}.")
    if not _is_text(query):
        return refused("the query holds characters that are not text (a lone surrogate).")
    if len(query) > MAX_QUERY_CHARS:
        return refused(
            f"the query is {len(query)} characters; give a few keywords (at most "
            f"{MAX_QUERY_CHARS} characters), for example a name."
        )
    bounds: list[int | None] = []
    for name in ("from_item", "to_item"):
        value = _whole_number(args.get(name), name, low=0, high=MAX_ITEM)
        if isinstance(value, Refusal):
            return value
        bounds.append(value)
    low, high = bounds
    if low is not None and high is not None and low > high:
        return refused(
            f"from_item ({low}) is after to_item ({high}); give from_item <= to_item, or leave "
            "either out."
        )
    return SearchArgs(query=query, from_item=low, to_item=high)


def _read_args(ref: object, page: object) -> ReadArgs | Refusal:
    if not isinstance(ref, str) or not _is_text(ref) or len(ref) > MAX_REF_CHARS:
        return refused("read takes the reference shown in an excerpt's pointer line, as text.")
    number = _whole_number(page, "page", low=1, high=MAX_PAGE)
    if isinstance(number, Refusal):
        return number
    return ReadArgs(ref=ref.strip(), page=number if number is not None else 1)


def _whole_number(value: object, name: str, *, low: int, high: int) -> int | Refusal | None:
    """An optional whole number within bounds; integral floats and digit strings are read too
    (models send ``12.0`` and ``"12"``)."""
    if value is None or value == "":
        return None
    number: int | None = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        number = int(value) if abs(value) <= high else high + 1
    elif isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        digits = value.strip()
        number = int(digits) if len(digits) <= len(str(high)) else high + 1
    if number is None:
        return refused(f"{name} must be a whole number, not {_kind(value)}.")
    if not low <= number <= high:
        return refused(f"{name} must be between {low} and {high}; leave it out for no bound.")
    return number


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _kind(value: object) -> str:
    if isinstance(value, str):
        return f"the text {value[:40]!r}" if _is_text(value) else "text with lone surrogates"
    if isinstance(value, float):
        return f"the number {value!r}"
    if isinstance(value, int) and not isinstance(value, bool):
        return "a number this large"
    return f"a {type(value).__name__}"
