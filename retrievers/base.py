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

import bisect
import inspect
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
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


@dataclass(frozen=True, slots=True)
class Spans:
    """Which positions a search may return: sorted, disjoint, half-open ranges ``[start, end)``.

    A conversation that forks (LangGraph time travel, an edit, a replay) keeps one archive per
    thread, and each branch sees only the passages of its own history: a search given
    ``within=Spans(...)`` returns passages at those positions only, and the sentence shown after
    a match is the next passage *within* the spans (the next one of that branch), never one of
    another branch. ``None`` (the default of every backend) means every passage of the session.
    """

    ranges: tuple[tuple[int, int], ...] = ()
    """The ranges, sorted and disjoint; adjacent ones are merged (``Spans.of`` makes them so)."""
    sequence: tuple[tuple[int, int], ...] = ()
    """The same positions in the branch's own order, when it is not the sorted one (a branch
    that took up passages another branch indexed first): what :meth:`following` walks.
    Empty: the sorted order (``Spans.ordered`` makes it so)."""
    _walk: tuple[tuple[int, int, int], ...] = field(
        default=(), init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        last = None
        for start, end in self.ranges:
            if start >= end or (last is not None and start <= last):
                raise ConfigurationError(
                    f"Spans need sorted, disjoint, non-empty ranges; got {self.ranges!r}: "
                    "build them with Spans.of(...)"
                )
            last = end
        if self.sequence:
            if sorted(self.sequence) != sorted(_split(self.ranges, self.sequence)):
                raise ConfigurationError(
                    f"Spans.sequence {self.sequence!r} does not hold the positions of "
                    f"{self.ranges!r}: build them with Spans.ordered(...)"
                )
            walk = sorted((start, end, index) for index, (start, end) in enumerate(self.sequence))
            object.__setattr__(self, "_walk", tuple(walk))

    @classmethod
    def ordered(cls, ranges: Iterable[tuple[int, int]]) -> Spans:
        """Spans from disjoint ranges listed in the branch's own order (empty ones dropped,
        consecutive ones that continue each other merged)."""
        sequence: list[list[int]] = []
        for start, end in ranges:
            if start >= end:
                continue
            if sequence and sequence[-1][1] == start:
                sequence[-1][1] = end
            else:
                sequence.append([start, end])
        spans = cls.of((a, b) for a, b in sequence)
        walked = tuple((a, b) for a, b in sequence)
        return spans if walked == spans.ranges else cls(spans.ranges, walked)

    @classmethod
    def of(cls, ranges: Iterable[tuple[int, int]]) -> Spans:
        """Spans from any ranges ``[start, end)``: empty ones dropped, overlapping and adjacent
        ones merged."""
        merged: list[list[int]] = []
        for start, end in sorted(r for r in ranges if r[0] < r[1]):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        return cls(tuple((a, b) for a, b in merged))

    def __contains__(self, position: object) -> bool:
        if not isinstance(position, int):
            return False
        index = bisect.bisect_right(self.ranges, (position, _ABOVE_ANY)) - 1
        return index >= 0 and self.ranges[index][0] <= position < self.ranges[index][1]

    def __bool__(self) -> bool:
        return bool(self.ranges)

    def __len__(self) -> int:
        """How many positions the spans hold."""
        return sum(end - start for start, end in self.ranges)

    def following(self, position: int) -> int | None:
        """The position within the spans that comes after ``position`` in the branch's order
        (None: there is none)."""
        if self._walk:
            index = bisect.bisect_right(self._walk, (position, _ABOVE_ANY, 0)) - 1
            if index < 0 or not self._walk[index][0] <= position < self._walk[index][1]:
                return None
            _start, end, order = self._walk[index]
            if position + 1 < end:
                return position + 1
            return self.sequence[order + 1][0] if order + 1 < len(self.sequence) else None
        nxt = position + 1
        index = bisect.bisect_right(self.ranges, (nxt, _ABOVE_ANY)) - 1
        if index >= 0 and nxt < self.ranges[index][1]:
            return nxt
        if index + 1 < len(self.ranges):
            return self.ranges[index + 1][0]
        return None

    def union(self, other: Spans) -> Spans:
        return Spans.of((*self.ranges, *other.ranges))

    @property
    def walk(self) -> tuple[tuple[int, int], ...]:
        """The ranges in the branch's own order."""
        return self.sequence or self.ranges

    def rank(self, position: int) -> int:
        """How many positions come before ``position`` in the branch's order (it must be
        within the spans)."""
        before = 0
        for start, end in self.walk:
            if start <= position < end:
                return before + position - start
            before += end - start
        raise ConfigurationError(f"{position} is not within {self!r}")


_ABOVE_ANY = 2**63
"""Sorts after any end of a range, so ``bisect`` finds the range a position falls in."""


def _split(
    ranges: Sequence[tuple[int, int]], pieces: Sequence[tuple[int, int]]
) -> list[tuple[int, int]]:
    """``ranges`` cut at every edge of ``pieces`` (for checking both hold the same positions)."""
    edges = sorted({edge for piece in pieces for edge in piece})
    result: list[tuple[int, int]] = []
    for start, end in ranges:
        cuts = [start, *(e for e in edges if start < e < end), end]
        result.extend(itertools.pairwise(cuts))
    return result


def keep_within(hits: Sequence[Hit], within: Spans | None) -> list[Hit]:
    """``hits`` whose passage lies within ``within`` (all of them when it is None)."""
    if within is None:
        return list(hits)
    return [hit for hit in hits if hit.passage.position in within]


@runtime_checkable
class Retriever(Protocol):
    """Adds passages as they arrive and finds the best matches for a query.

    Adding is incremental (an archive grows for months; no full re-index per add). Adding a
    passage at a (session, position) that is already stored replaces it, so re-adding after a
    crash is harmless. Every filter is optional; ``from_item``/``to_item`` are inclusive. A query
    with no word in it (empty, only punctuation) finds nothing. A search always sees every
    passage added before it: a backend that indexes in the background waits for that session's
    queue first. ``flush`` waits until everything added is searchable; ``close`` flushes too.

    ``within`` (keyword only) limits a search to the positions of one branch of a forked
    conversation (:class:`Spans`): no passage outside it is returned, and the sentence shown after
    a match is the next one within it. A backend written before branches existed, without the
    argument, still works: the keeper then asks it for more and keeps what lies within.
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
        within: Spans | None = None,
    ) -> list[Hit]: ...

    def count(self, session: str) -> int: ...

    def delete_session(self, session: str) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


def stored_count(retriever: object, session: str) -> int | None:
    """How many of the session's passages the retriever's index holds, for a backend that
    counts what it stores (``counts_stored = True``, or a ``stored_count`` method of its own);
    None for one that cannot tell (a LangChain store counts only what this process added)."""
    own = getattr(retriever, "stored_count", None)
    if own is not None:
        found = own(session)
        return None if found is None else int(found)
    if getattr(retriever, "counts_stored", False):
        return int(retriever.count(session))  # type: ignore[attr-defined]
    return None


def takes_within(retriever: object) -> bool:
    """Whether ``retriever.search`` accepts ``within=`` (every backend here does; one written
    before branches existed may not)."""
    kind = type(retriever)
    known = _TAKES_WITHIN.get(kind)
    if known is None:
        try:
            parameters = inspect.signature(retriever.search).parameters  # type: ignore[attr-defined]
        except (TypeError, ValueError):
            parameters = {}  # type: ignore[assignment]
        known = "within" in parameters or any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
        )
        _TAKES_WITHIN[kind] = known
    return known


_TAKES_WITHIN: dict[type, bool] = {}
_GROW = 4


def search_within(
    retriever: Retriever,
    query: str,
    *,
    session: str,
    k: int = 10,
    from_item: int | None = None,
    to_item: int | None = None,
    within: Spans | None = None,
    search: Callable[..., list[Hit]] | None = None,
) -> list[Hit]:
    """``retriever.search`` limited to ``within``, whether or not the backend takes the argument.
    ``search``: another search method of the same retriever to call (a hybrid's embedding side
    may read only the vectors written so far).

    A backend that does not is asked for more hits, four times as many each round, until ``k``
    of them lie within the spans or it has no more to give; the sentence shown after a match is
    kept only when it is the next position within the spans (the backend cannot be asked for
    another), so no text of another branch is ever shown.
    """
    run = retriever.search if search is None else search
    if within is None:
        return run(query, session=session, k=k, from_item=from_item, to_item=to_item)
    if not within:
        return []
    if takes_within(retriever):
        return run(query, session=session, k=k, from_item=from_item, to_item=to_item, within=within)
    asked = k * _GROW
    while True:
        found = run(query, session=session, k=asked, from_item=from_item, to_item=to_item)
        kept = keep_within(found, within)
        if len(kept) >= k or len(found) < asked:
            break
        asked *= _GROW
    return [
        hit
        if within.following(hit.passage.position) == hit.passage.position + 1
        else replace(hit, next_text="")
        for hit in kept[:k]
    ]


@runtime_checkable
class CountingRetriever(Protocol):
    """A retriever that ranks the few hits shown apart from counting how many match.

    The search tool shows ten hits and says how many there are, up to a scan of 200. Ranking
    200 hits to count them costs a fused backend most of its search, and ranks the ten shown
    from deeper lists than it was tuned for; a backend that can count more cheaply says so here.
    """

    def search_counted(
        self,
        query: str,
        *,
        session: str,
        k: int,
        limit: int,
        from_item: int | None = None,
        to_item: int | None = None,
        within: Spans | None = None,
    ) -> tuple[list[Hit], int]:
        """The best ``k`` hits, as ``search`` ranks them, and how many passages match, counted
        up to ``limit``."""
        ...


def search_and_count(
    retriever: Retriever,
    query: str,
    *,
    session: str,
    k: int,
    limit: int,
    from_item: int | None = None,
    to_item: int | None = None,
    within: Spans | None = None,
) -> tuple[list[Hit], int]:
    """The best ``k`` hits within the spans, and how many passages match (up to ``limit``).

    A :class:`CountingRetriever` ranks and counts on its own terms; any other backend is searched
    for ``limit`` hits, the first ``k`` shown and the rest counted.

    Raises:
        ConfigurationError: ``k`` is not positive, or ``limit`` is below it.
    """
    check_search_arguments(k, from_item, to_item)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < k:
        raise ConfigurationError(
            f"limit must be an int of at least k={k} (how many matches to count), got {limit!r}."
        )
    if within is not None and not within:
        return [], 0
    if isinstance(retriever, CountingRetriever):
        return retriever.search_counted(
            query,
            session=session,
            k=k,
            limit=limit,
            from_item=from_item,
            to_item=to_item,
            within=within,
        )
    hits = search_within(
        retriever,
        query,
        session=session,
        k=limit,
        from_item=from_item,
        to_item=to_item,
        within=within,
    )
    return hits[:k], len(hits)


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
