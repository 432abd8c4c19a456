"""The archive search tool: what it shows, and the guards that end search loops.

Every rule here is a fix for a measured failure:
- results count in the content's own numbers (items), never message indices;
- each match is shown with the sentence after it ("it" hides the change in the next sentence);
- a list cut short says so in its first line ("the first 40 of 63" read at the end as "all");
- the same search twice in a row is refused; a search sent a third time since the last new input
  is refused (the archive has not changed); after three refusals in a row the model is told to
  stop and answer, and that reply is sampled with some randomness (a refusal alone did not end a
  loop of 362 identical searches).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from keeper_middleware.retrievers.base import Hit
from keeper_middleware.retrievers.passages import excerpt

SEARCH_TOOL_NAME = "search_archive"
SEARCH_TOOL_DESCRIPTION = (
    "Search the archive of earlier turns that are no longer in view (word for word). "
    "Give a few keywords, e.g. a name. Optional from_item / to_item (inclusive) limit the search "
    "to a range of items, in the items' own numbers. Each match is shown with the sentence that "
    "follows it. A message shown as an excerpt names its reference: read=REF with page=N reads "
    "it whole, page by page."
)
STOP_LINE = "Stop searching now and answer with what you have."


@dataclass(frozen=True, slots=True)
class SearchCommand:
    """One search, normalised so that repeats are recognised."""

    query: str
    from_item: int | None = None
    to_item: int | None = None
    read: str | None = None
    """A read of one archived message (``page`` of it) instead of a search."""
    page: int = 1

    @property
    def key(self) -> str:
        if self.read is not None:
            return f"read|{self.read}|{self.page}"
        return f"{' '.join(self.query.casefold().split())}|{self.from_item}|{self.to_item}"


@dataclass(frozen=True, slots=True)
class GuardState:
    """What the guards remember; JSON-like so it persists beside the archive."""

    last_key: str | None = None
    counts: dict[str, int] = field(default_factory=dict)
    refusals_in_row: int = 0
    sample_next: bool = False
    since_input: int = 0
    """Searches run since the last new input (reads of an archived message do not count)."""

    def to_json(self) -> dict[str, object]:
        return {
            "last_key": self.last_key,
            "counts": dict(self.counts),
            "refusals_in_row": self.refusals_in_row,
            "sample_next": self.sample_next,
            "since_input": self.since_input,
        }

    @classmethod
    def from_json(cls, data: object) -> GuardState:
        if not isinstance(data, dict):
            return cls()
        counts = data.get("counts") or {}
        return cls(
            last_key=data.get("last_key"),
            counts={str(k): int(v) for k, v in counts.items()},
            refusals_in_row=int(data.get("refusals_in_row") or 0),
            sample_next=bool(data.get("sample_next")),
            since_input=int(data.get("since_input") or 0),
        )


Verdict = Literal["run", "refuse", "stop"]


@dataclass(frozen=True, slots=True)
class GuardDecision:
    verdict: Verdict
    message: str
    """The refusal or stop text; empty when the search runs."""
    state: GuardState


def decide(
    state: GuardState, command: SearchCommand, *, budget: int | None = None
) -> GuardDecision:
    """Run, refuse or stop a search, and the guard state after it (pure).

    ``budget`` is how many searches may run between two new inputs; past it every search is
    stopped (a model that searches with a new query each time is never caught by the repeat
    guards: 127 of 128 such searches ran before the budget).
    """
    key = command.key
    reading = command.read is not None
    if budget is not None and not reading and state.since_input >= budget:
        return GuardDecision(
            "stop",
            f"Refused: {state.since_input} searches have run since the last new input, the "
            f"most allowed. {STOP_LINE}",
            replace(state, refusals_in_row=0, sample_next=True),
        )
    reason = ""
    if key == state.last_key:
        reason = (
            "Refused: this is the same search as the one just before; its results are above. "
            "Use them, or search for something else."
        )
    elif state.counts.get(key, 0) >= 2:
        reason = (
            "Refused: this search was already sent twice since the last new input, and the "
            "archive has not changed. Use the results you have."
        )
    if not reason:
        counts = {**state.counts, key: state.counts.get(key, 0) + 1}
        ran = state.since_input + (0 if reading else 1)
        return GuardDecision(
            "run",
            "",
            replace(state, last_key=key, counts=counts, refusals_in_row=0, since_input=ran),
        )
    refusals = state.refusals_in_row + 1
    if refusals >= 3:
        return GuardDecision(
            "stop", f"{reason}\n{STOP_LINE}", replace(state, refusals_in_row=0, sample_next=True)
        )
    return GuardDecision("refuse", reason, replace(state, refusals_in_row=refusals))


def after_new_input(state: GuardState) -> GuardState:
    """New input arrived: the archive may have changed, so every search may run again."""
    return GuardState(sample_next=state.sample_next)


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
    max_tokens: int | None = None,
    count: Callable[[str], int] | None = None,
) -> str:
    """The tool's reply: a first line that says whether the list is whole, then one line a match.

    ``hits`` are the best matches in rank order (at most ``scanned`` were looked at); the shown
    ones are listed in item order, so the story reads forward. With ``max_tokens`` the reply is
    sized to it: the lowest-ranked matches are left out first (the first line says how many are
    shown), then the one left is clipped.
    """
    query = _clip(" ".join(command.query.split()), QUERY_ECHO_CHARS)
    if not hits:
        return f'No matches for "{query}"' + _range_note(command) + "."
    number = min(shown, len(hits))
    while True:
        text = _render(command, query, hits, number, scanned)
        if max_tokens is None or count is None or count(text) <= max_tokens or number == 1:
            break
        number = max(1, min(number - 1, number * 3 // 4))
    if max_tokens is not None and count is not None and count(text) > max_tokens:
        text = _clip_to(text, max_tokens, count)
    return text


def _render(
    command: SearchCommand, query: str, hits: Sequence[Hit], number: int, scanned: int
) -> str:
    chosen = sorted(hits[:number], key=lambda h: (h.passage.item, h.passage.position))
    if len(hits) > number:
        total = f"more than {scanned - 1}" if len(hits) >= scanned else str(len(hits))
        head = (
            f'Showing {len(chosen)} of {total} matches for "{query}"{_range_note(command)} '
            "(the list is cut short; these are the nearest to the query; narrow it with "
            "from_item/to_item)."
        )
    else:
        plural = "match" if len(hits) == 1 else "matches"
        head = f'Found {len(hits)} {plural} for "{query}"{_range_note(command)}.'
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
