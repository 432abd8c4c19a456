"""What the archive search tool shows: the matches, in the content's own numbers.

Every rule here is a fix for a measured failure:

- results count in the content's own numbers (items), never message indices;
- each match is shown with the sentence after it ("it" hides the change in the next sentence);
- a list cut short says so in its first line ("the first 40 of 63" read at the end as "all").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from keeper_middleware.retrievers.base import Hit
from keeper_middleware.retrievers.passages import excerpt
from keeper_middleware.search.guards import SearchCommand

QUERY_ECHO_CHARS = 120
"""The query is echoed at most this long (a 100KB query once came back doubled)."""
PASSAGE_CHARS = 600
"""One shown passage (and its next sentence) at most this long: a minified line is one "sentence"."""


def render_results(
    command: SearchCommand,
    hits: Sequence[Hit],
    *,
    shown: int,
    scanned: int,
    total: int | None = None,
    max_tokens: int | None = None,
    count: Callable[[str], int] | None = None,
) -> str:
    """The tool's reply: a first line that says whether the list is whole, then one line a match.

    ``hits`` are the best matches in rank order; ``total`` says how many match, counted up to
    ``scanned`` (``len(hits)`` when None: the hits are all that were found). The shown ones are
    listed in item order, so the story reads forward. With ``max_tokens`` the reply is
    sized to it: the lowest-ranked matches are left out first (the first line says how many are
    shown), then the one left is clipped.
    """
    query = _clip(" ".join(command.query.split()), QUERY_ECHO_CHARS)
    if not hits:
        return f'No matches for "{query}"' + _range_note(command) + "."
    number = min(shown, len(hits))
    total = len(hits) if total is None else max(total, len(hits))
    while True:
        text = _render(command, query, hits, number, total, scanned)
        if max_tokens is None or count is None or count(text) <= max_tokens or number == 1:
            break
        number = max(1, min(number - 1, number * 3 // 4))
    if max_tokens is not None and count is not None and count(text) > max_tokens:
        text = _clip_to(text, max_tokens, count)
    return text


def _render(
    command: SearchCommand, query: str, hits: Sequence[Hit], number: int, total: int, scanned: int
) -> str:
    chosen = sorted(hits[:number], key=lambda h: (h.passage.item, h.passage.position))
    if total > number:
        counted = f"more than {scanned - 1}" if total >= scanned else str(total)
        head = (
            f'Showing {len(chosen)} of {counted} matches for "{query}"{_range_note(command)} '
            "(the list is cut short; these are the nearest to the query; narrow it with "
            "from_item/to_item)."
        )
    else:
        plural = "match" if total == 1 else "matches"
        head = f'Found {total} {plural} for "{query}"{_range_note(command)}.'
    lines = [head]
    for hit in chosen:
        # a long passage (a minified line is one "sentence") is clipped, like the query echo
        lines.append(f"item {hit.passage.item}: {_clip(excerpt(hit), PASSAGE_CHARS * 3 // 2)}")
    return "\n".join(lines)


def _clip(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: chars - 1] + "…"


def _clip_to(text: str, tokens: int, count: Callable[[str], int]) -> str:
    """The longest head of ``text`` within ``tokens`` (with a mark that it was clipped)."""
    low, high = 0, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        if count(text[:middle] + "…") <= tokens:
            low = middle
        else:
            high = middle - 1
    return text[:low] + "…"


def _range_note(command: SearchCommand) -> str:
    if command.from_item is None and command.to_item is None:
        return ""
    if command.from_item is None:
        return f" in items up to {command.to_item}"
    if command.to_item is None:
        return f" in items from {command.from_item}"
    return f" in items {command.from_item} to {command.to_item}"
