"""Keyword and embedding search fused by reciprocal rank.

BM25 finds what a question names exactly (``domo86``); embeddings find what it says in other
words. Reciprocal-rank fusion needs no score calibration between the two: each list contributes
``1 / (k_rrf + rank)`` per passage. Each list is asked for ``depth`` times the hits wanted, 1 by
default: on real dialogue (LoCoMo, both halves of the questions) and on the benchmark's streams,
deeper lists let a passage ranked middling by both sides push out one that a single side ranks
first (``bench/results/locomo_recall.md``, tenth round: any@5 0.64 at depth 2, 0.67 at depth 1).

The fused ranking then goes through the reply window (``retrievers/reply_window.py``): a
passage also counts the fused scores of the two passages before it, so the reply that holds an
answer rises with the turn that matched the question (LoCoMo any@5 0.704 → 0.740, a gain on each
of five conversations); ``replies=None`` turns it off.

The keyword side writes as passages are added; the embedding side embeds them in the
background (tens of milliseconds of CPU a message). A search waits for its session's vectors
(the ``Retriever`` contract: every passage added before it is seen), unless made with
``wait_for_vectors=False``, as the keeper makes its own: then passages whose vectors are not
written yet (right after a cut) are ranked by the keyword side alone until they are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from keeper_middleware.errors import ConfigurationError
from keeper_middleware.retrievers.base import (
    CountingRetriever,
    Hit,
    Passage,
    Retriever,
    Spans,
    check_search_arguments,
    search_and_count,
    search_within,
    stored_count,
)
from keeper_middleware.retrievers.reply_window import (
    DEFAULT_REPLY_WINDOW,
    PassageLookup,
    ReplyWindow,
    reply_ranking,
)

DEFAULT_K_RRF = 60
DEFAULT_KEYWORD_WEIGHT = 1.0
DEFAULT_DEPTH = 1
FUSIONS = ("rrf", "score")
"""How the two lists are merged: by rank (``rrf``) or by each list's scores scaled to [0, 1]
(``score``)."""
DEFAULT_FUSION = "rrf"


def reciprocal_rank_fusion(
    lists: Sequence[Sequence[Hit]],
    *,
    k: int,
    k_rrf: int = 60,
    weights: Sequence[float] | None = None,
) -> list[Hit]:
    """Merges ranked lists of one session's hits, list ``i`` counting ``weights[i]`` times
    (all 1 when None); ties go to the newer passage."""
    if weights is not None and len(weights) != len(lists):
        raise ConfigurationError(
            f"weights has {len(weights)} entries for {len(lists)} lists of hits."
        )
    scores: dict[int, float] = {}
    hits: dict[int, Hit] = {}
    for index, ranked in enumerate(lists):
        weight = 1.0 if weights is None else weights[index]
        for rank, hit in enumerate(ranked, start=1):
            position = hit.passage.position
            scores[position] = scores.get(position, 0.0) + weight / (k_rrf + rank)
            if position not in hits or (not hits[position].next_text and hit.next_text):
                hits[position] = hit
    order = sorted(scores, key=lambda position: (-scores[position], -position))
    return [
        Hit(
            passage=hits[p].passage,
            score=scores[p],
            next_text=hits[p].next_text,
            sentence=hits[p].sentence,
        )
        for p in order[:k]
    ]


def score_fusion(
    lists: Sequence[Sequence[Hit]],
    *,
    k: int,
    weights: Sequence[float] | None = None,
) -> list[Hit]:
    """Merges ranked lists of one session's hits by their scores: each list's scores are scaled
    to [0, 1] (its best hit 1, its worst 0; all 1 when they are equal), a passage sums its scaled
    scores, list ``i`` counting ``weights[i]`` times; ties go to the newer passage. Unlike
    :func:`reciprocal_rank_fusion` it keeps how far ahead a list's first hit is."""
    if weights is not None and len(weights) != len(lists):
        raise ConfigurationError(
            f"weights has {len(weights)} entries for {len(lists)} lists of hits."
        )
    scores: dict[int, float] = {}
    hits: dict[int, Hit] = {}
    for index, ranked in enumerate(lists):
        if not ranked:
            continue
        weight = 1.0 if weights is None else weights[index]
        low = min(hit.score for hit in ranked)
        span = max(hit.score for hit in ranked) - low
        for hit in ranked:
            position = hit.passage.position
            scaled = (hit.score - low) / span if span > 0 else 1.0
            scores[position] = scores.get(position, 0.0) + weight * scaled
            if position not in hits or (not hits[position].next_text and hit.next_text):
                hits[position] = hit
    order = sorted(scores, key=lambda position: (-scores[position], -position))
    return [replace(hits[p], score=scores[p]) for p in order[:k]]


@dataclass(frozen=True, slots=True)
class _Span:
    """Where one fused search looks: the session, the items, the branch."""

    session: str
    from_item: int | None
    to_item: int | None
    within: Spans | None

    def search(
        self,
        backend: Retriever,
        query: str,
        *,
        k: int,
        run: Callable[..., list[Hit]] | None = None,
    ) -> list[Hit]:
        return search_within(
            backend,
            query,
            session=self.session,
            k=k,
            from_item=self.from_item,
            to_item=self.to_item,
            within=self.within,
            search=run,
        )


class HybridRetriever:
    """Adds to both backends and fuses their results; owns both (closing it closes them)."""

    def __init__(
        self,
        keyword: Retriever,
        embedding: Retriever,
        *,
        k_rrf: int = DEFAULT_K_RRF,
        keyword_weight: float = DEFAULT_KEYWORD_WEIGHT,
        depth: int = DEFAULT_DEPTH,
        wait_for_vectors: bool = True,
        fusion: str = DEFAULT_FUSION,
        replies: ReplyWindow | None = DEFAULT_REPLY_WINDOW,
    ) -> None:
        """``keyword_weight`` is how much a keyword rank counts against an embedding rank;
        each backend is asked for ``depth`` times the hits wanted. ``wait_for_vectors=False``:
        a search ranks the passages whose vectors are still queued by keyword alone instead of
        waiting for them (see the module docstring). ``fusion``: "rrf" merges the lists by rank
        (``k_rrf``), "score" by each list's scores scaled to [0, 1] (:func:`score_fusion`).
        ``replies``: the reply window the fused ranking goes through (None: none); the passages
        after a hit come from the keyword side when it can look them up (``PassageLookup``),
        otherwise only the fused hits are re-ranked.

        Raises:
            ConfigurationError: an unknown fusion, or a depth, ``k_rrf`` or weight out of range.
        """
        if fusion not in FUSIONS:
            raise ConfigurationError(f"fusion must be one of {', '.join(FUSIONS)}, got {fusion!r}.")
        self._fusion = fusion
        self._replies = replies
        self._wait_for_vectors = wait_for_vectors
        if depth < 1:
            raise ConfigurationError(
                f"depth must be a positive int (1 is the default), got {depth}."
            )
        self._depth = depth
        if k_rrf < 1:
            raise ConfigurationError(
                f"k_rrf must be a positive int (60 is the usual choice), got {k_rrf}."
            )
        if not keyword_weight > 0.0:
            raise ConfigurationError(
                f"keyword_weight must be above 0 (1 counts both lists alike), got {keyword_weight}."
            )
        self._keyword = keyword
        self._embedding = embedding
        self._k_rrf = k_rrf
        self._weights = (keyword_weight, 1.0)

    @property
    def waits_for_vectors(self) -> bool:
        """Whether a search waits for its session's queued vectors (see ``__init__``)."""
        return self._wait_for_vectors

    def add(self, passages: Sequence[Passage]) -> None:
        self._keyword.add(passages)
        self._embedding.add(passages)

    def search(
        self,
        query: str,
        *,
        session: str,
        k: int = 10,
        from_item: int | None = None,
        to_item: int | None = None,
        within: Spans | None = None,
    ) -> list[Hit]:
        check_search_arguments(k, from_item, to_item)
        span = _Span(session, from_item, to_item, within)
        keyword = span.search(self._keyword, query, k=self._depth * k)
        embedded = span.search(self._embedding, query, k=self._depth * k, run=self._embedded())
        return self._ranked([keyword, embedded], span, k=k)

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
        """The ``k`` hits ``search`` would return, and how many passages match up to ``limit``:
        those that share a word with the query, and the nearest by meaning that were fused.

        Only the keyword side is asked for ``limit`` hits; the embedding side, where every
        passage is near to some degree, is asked for what the fusion ranks. So a search that
        shows ten hits costs about what ``search(k=10)`` does, not a fusion of 400-deep lists.
        A keyword side that counts on its own (a :class:`CountingRetriever`, tantivy's) is asked
        for the hits the fusion ranks and the count: when ``limit`` passages match, that is the
        count, and the hits are those ``search`` fuses, without ranking and reading ``limit``
        keyword hits (measured at 1M passages: bench/results/index_cost.md, "Round six");
        fewer, and the matches are searched for as above, to count them with the embedding's.
        """
        check_search_arguments(k, from_item, to_item)
        span = _Span(session, from_item, to_item, within)
        depth = self._depth * k
        if isinstance(self._keyword, CountingRetriever) and depth <= limit:
            shown, matches = search_and_count(
                self._keyword,
                query,
                session=session,
                k=depth,
                limit=limit,
                from_item=from_item,
                to_item=to_item,
                within=within,
            )
            if matches >= limit:
                embedded = span.search(self._embedding, query, k=depth, run=self._embedded())
                return self._fuse([shown, embedded], k=k), limit
        keyword = span.search(self._keyword, query, k=max(depth, limit))
        embedded = span.search(self._embedding, query, k=depth, run=self._embedded())
        hits = self._ranked([keyword[:depth], embedded], span, k=k)
        matched = {hit.passage.position for hit in keyword}
        matched.update(hit.passage.position for hit in embedded)
        return hits, min(len(matched), limit)

    def _ranked(self, lists: Sequence[Sequence[Hit]], span: _Span, *, k: int) -> list[Hit]:
        """The lists fused, then through the reply window when there is one."""
        if self._replies is None:
            return self._fuse(lists, k=k)
        fused = self._fuse(lists, k=sum(len(hits) for hits in lists))
        return reply_ranking(fused, self._after(fused, span), self._replies)[:k]

    def _after(self, fused: Sequence[Hit], span: _Span) -> list[Passage]:
        """The stored passages just after the fused hits, where the search may look."""
        if self._replies is None or not fused or not isinstance(self._keyword, PassageLookup):
            return []
        low = span.from_item
        high = span.to_item
        return [
            passage
            for passage in self._keyword.passages_at(span.session, self._replies.after(fused))
            if (low is None or passage.item >= low)
            and (high is None or passage.item <= high)
            and (span.within is None or passage.position in span.within)
        ]

    def _fuse(self, lists: Sequence[Sequence[Hit]], *, k: int) -> list[Hit]:
        if self._fusion == "score":
            return score_fusion(lists, k=k, weights=self._weights)
        return reciprocal_rank_fusion(lists, k=k, k_rrf=self._k_rrf, weights=self._weights)

    def _embedded(self) -> Callable[..., list[Hit]]:
        """The embedding side's search; over the vectors written so far when a search does not
        wait for them."""
        if self._wait_for_vectors:
            return self._embedding.search
        return getattr(self._embedding, "search_written", self._embedding.search)  # type: ignore[no-any-return]

    def count(self, session: str) -> int:
        return self._keyword.count(session)

    def stored_count(self, session: str) -> int | None:
        """The fewer of the two sides' stored passages (a side whose index was deleted holds
        none, and is rebuilt), or None when neither side can tell."""
        counts = [stored_count(side, session) for side in (self._keyword, self._embedding)]
        known = [count for count in counts if count is not None]
        return min(known) if known else None

    def delete_session(self, session: str) -> None:
        self._keyword.delete_session(session)
        self._embedding.delete_session(session)

    def flush(self) -> None:
        self._keyword.flush()
        self._embedding.flush()

    def close(self) -> None:
        try:
            self._keyword.close()
        finally:
            self._embedding.close()

    def __repr__(self) -> str:
        return (
            f"HybridRetriever({self._keyword!r}, {self._embedding!r}, k_rrf={self._k_rrf}, "
            f"keyword_weight={self._weights[0]}, replies={self._replies!r})"
        )
