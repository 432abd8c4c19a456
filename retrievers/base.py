"""The one contract every retrieval backend meets.

A passage is a sentence-level unit of the archive, numbered in the content's own numbering (the
item it arrived in), never by message index: mixing the two numberings cost real answers. Search
results carry the sentence that follows each match, because text that says "it" hides the change
in the next sentence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class Passage:
    """One sentence of archived text."""

    session: str
    """The conversation (thread) it belongs to; searches never cross sessions."""
    item: int
    """The content's own number for the input this sentence arrived in (item, batch, ticket)."""
    position: int
    """Order of the sentence within its session, strictly increasing as passages are added."""
    text: str
    """The sentence, word for word."""


@dataclass(frozen=True, slots=True)
class Hit:
    """A search result: the matching passage and the sentence that follows it."""

    passage: Passage
    score: float
    """Higher is better; only comparable within one search of one backend."""
    next_text: str = ""
    """The passage at ``position + 1`` in the same session, or "" when there is none yet."""


@runtime_checkable
class Retriever(Protocol):
    """Adds passages as they arrive and finds the best matches for a query.

    Adding is incremental (an archive grows for months; no full re-index per add). Every filter is
    optional; ``from_item``/``to_item`` are inclusive.
    """

    def add(self, passages: Sequence[Passage]) -> None: ...

    def search(
        self,
        query: str,
        *,
        session: str,
        k: int = 10,
        from_item: int | None = None,
        to_item: int | None = None,
    ) -> list[Hit]: ...

    def count(self, session: str) -> int: ...

    def delete_session(self, session: str) -> None: ...

    def close(self) -> None: ...
