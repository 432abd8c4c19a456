"""The one contract every retrieval backend meets, and the errors they raise.

A passage is a unit of the archive (a sentence, or a whole message cut into bounded chunks), numbered in the content's own numbering (the
item it arrived in), never by message index: mixing the two numberings cost real answers. Search
results carry the sentence that follows each match, because text that says "it" hides the change
in the next sentence.

Errors (all are :class:`~keeper_middleware.errors.KeeperError`)::

    RetrieverError
    └── ServerUnavailableError (also a ConnectionError: a configured server did not answer)
    MissingExtraError          the core's MissingDependencyError (also an ImportError)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from keeper_middleware.errors import (
    ArgumentTypeError,
    ConfigurationError,
    KeeperError,
    MissingDependencyError,
)


@dataclass(frozen=True, slots=True)
class Passage:
    """One sentence, or one bounded chunk of a message, of archived text."""

    session: str
    """The conversation (thread) it belongs to; searches never cross sessions."""
    item: int
    """The content's own number for the input this sentence arrived in (item, batch, ticket)."""
    position: int
    """Order of the sentence within its session, strictly increasing as passages are added."""
    text: str
    """The sentence or message chunk, word for word."""
    context: str = ""
    """What the words alone do not say (who wrote them, when, in which item): indexed with the
    text, so a search for a speaker or a date finds the passage, but never shown as its text."""

    def __post_init__(self) -> None:
        if not isinstance(self.session, str) or not self.session:
            raise ConfigurationError(
                f"Passage.session must be a non-empty string, got {self.session!r}."
            )
        if isinstance(self.position, bool) or not isinstance(self.position, int):
            raise ArgumentTypeError(f"Passage.position must be an int, got {self.position!r}.")
        if self.position < 0:
            raise ConfigurationError(f"Passage.position must be 0 or more, got {self.position}.")
        if isinstance(self.item, bool) or not isinstance(self.item, int):
            raise ArgumentTypeError(
                f"Passage.item must be an int (the content's number), got {self.item!r}."
            )
        if not isinstance(self.text, str):
            raise ArgumentTypeError(
                f"Passage.text must be a string, got {type(self.text).__name__}."
            )
        if not isinstance(self.context, str):
            raise ArgumentTypeError(
                f"Passage.context must be a string, got {type(self.context).__name__}."
            )

    @property
    def indexed_text(self) -> str:
        """What the backends index: the context, then the words."""
        return f"{self.context}: {self.text}" if self.context else self.text


@dataclass(frozen=True, slots=True)
class Hit:
    """A search result: the matching passage and the passage that follows it.

    A passage that holds a whole message also says which of its sentences matched best
    (``sentence``), so a result can show that sentence marked, and the one after it, within a
    bounded excerpt of the message (``retrievers.passages.excerpt``).
    """

    passage: Passage
    """The passage that matched."""
    score: float
    """Higher is better; only comparable within one search of one backend."""
    next_text: str = ""
    """The passage at ``position + 1`` in the same session, or "" when there is none yet."""
    sentence: int = 0
    """Index of the best-matching sentence among ``split_sentences(passage.text)``."""


@runtime_checkable
class Retriever(Protocol):
    """Adds passages as they arrive and finds the best matches for a query.

    Adding is incremental (an archive grows for months; no full re-index per add). Adding a
    passage at a (session, position) that is already stored replaces it, so re-adding after a
    crash is harmless. Every filter is optional; ``from_item``/``to_item`` are inclusive. A query
    with no word in it (empty, only punctuation) finds nothing. A search always sees every
    passage added before it: a backend that indexes in the background waits for that session's
    queue first. ``flush`` waits until everything added is searchable; ``close`` flushes too.
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

    def flush(self) -> None: ...

    def close(self) -> None: ...


class RetrieverError(KeeperError):
    """Base of the errors raised by retrieval backends."""


MissingExtraError = MissingDependencyError
"""An optional dependency of a backend is not installed (the core's error, under its old name)."""


class ServerUnavailableError(RetrieverError, ConnectionError):
    """A configured search server did not answer; the message names the URL it was looked for at."""


class IndexingFailedError(RetrieverError, RuntimeError):
    """Indexing in the background failed; the passages still queued were not indexed."""


def check_search_arguments(k: int, from_item: int | None, to_item: int | None) -> None:
    """Rejects arguments every backend would misread, with the fix in the message."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigurationError(f"k must be a positive int (how many hits to return), got {k!r}.")
    if from_item is not None and to_item is not None and from_item > to_item:
        raise ConfigurationError(
            f"from_item ({from_item}) is after to_item ({to_item}); both are inclusive, "
            "so swap them or drop one."
        )
