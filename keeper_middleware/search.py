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

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from keeper_middleware.retrievers.base import Hit
from keeper_middleware.retrievers.passages import excerpt

SEARCH_TOOL_NAME = "search_archive"
SEARCH_TOOL_DESCRIPTION = (
    "Search the archive of earlier turns that are no longer in view (word for word). "
    "Give a few keywords, e.g. a name. Optional from_item / to_item (inclusive) limit the search "
    "to a range of items, in the items' own numbers. Each match is shown with the sentence that "
    "follows it."
)
STOP_LINE = "Stop searching now and answer with what you have."


@dataclass(frozen=True, slots=True)
class SearchCommand:
    """One search, normalised so that repeats are recognised."""

    query: str
    from_item: int | None = None
    to_item: int | None = None

    @property
    def key(self) -> str:
        return f"{' '.join(self.query.casefold().split())}|{self.from_item}|{self.to_item}"


@dataclass(frozen=True, slots=True)
class GuardState:
    """What the guards remember; JSON-like so it persists beside the archive."""

    last_key: str | None = None
    counts: dict[str, int] = field(default_factory=dict)
    refusals_in_row: int = 0
    sample_next: bool = False

    def to_json(self) -> dict[str, object]:
        return {
            "last_key": self.last_key,
            "counts": dict(self.counts),
            "refusals_in_row": self.refusals_in_row,
            "sample_next": self.sample_next,
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
        )


Verdict = Literal["run", "refuse", "stop"]


@dataclass(frozen=True, slots=True)
class GuardDecision:
    verdict: Verdict
    message: str
    """The refusal or stop text; empty when the search runs."""
    state: GuardState


def decide(state: GuardState, command: SearchCommand) -> GuardDecision:
    """Run, refuse or stop a search, and the guard state after it (pure)."""
    key = command.key
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
        return GuardDecision(
            "run", "", replace(state, last_key=key, counts=counts, refusals_in_row=0)
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


def render_results(command: SearchCommand, hits: Sequence[Hit], *, shown: int, scanned: int) -> str:
    """The tool's reply: a first line that says whether the list is whole, then one line a match.

    ``hits`` are the best matches in rank order (at most ``scanned`` were looked at); the shown
    ones are listed in item order, so the story reads forward.
    """
    query = command.query.strip()
    if not hits:
        return f'No matches for "{query}"' + _range_note(command) + "."
    chosen = sorted(hits[:shown], key=lambda h: (h.passage.item, h.passage.position))
    if len(hits) > shown:
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
        lines.append(f"item {hit.passage.item}: {excerpt(hit)}")
    return "\n".join(lines)


def _range_note(command: SearchCommand) -> str:
    if command.from_item is None and command.to_item is None:
        return ""
    if command.from_item is None:
        return f" in items up to {command.to_item}"
    if command.to_item is None:
        return f" in items from {command.from_item}"
    return f" in items {command.from_item} to {command.to_item}"
