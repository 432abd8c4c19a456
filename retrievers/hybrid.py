"""Keyword and embedding search fused by reciprocal rank.

BM25 finds what a question names exactly (``domo86``); embeddings find what it says in other
words. Reciprocal-rank fusion needs no score calibration between the two: each list contributes
``1 / (k_rrf + rank)`` per passage, and each list is asked for ``depth`` times the hits wanted so a passage
ranked low by one backend can still be lifted by the other.

The keyword side writes as passages are added; the embedding side embeds them in the
background (tens of milliseconds of CPU a message). A search waits for its session's vectors
(the ``Retriever`` contract: every passage added before it is seen), unless made with
``wait_for_vectors=False``, as the keeper makes its own: then passages whose vectors are not
written yet (right after a cut) are ranked by the keyword side alone until they are.
"""

from __future__ import annotations

from collections.abc import Sequence

from keeper_middleware.errors import ConfigurationError
from keeper_middleware.retrievers.base import (
    Hit,
    Passage,
    Retriever,
    Spans,
    check_search_arguments,
    search_within,
)

DEFAULT_K_RRF = 60
DEFAULT_KEYWORD_WEIGHT = 1.0
DEFAULT_DEPTH = 2


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
    ) -> None:
        """``keyword_weight`` is how much a keyword rank counts against an embedding rank;
        each backend is asked for ``depth`` times the hits wanted. ``wait_for_vectors=False``:
        a search ranks the passages whose vectors are still queued by keyword alone instead of
        waiting for them (see the module docstring)."""
        self._wait_for_vectors = wait_for_vectors
        if depth < 1:
            raise ConfigurationError(
                f"depth must be a positive int (2 is the default), got {depth}."
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
        embedded = self._embedding.search
        if not self._wait_for_vectors:
            embedded = getattr(self._embedding, "search_written", embedded)
        lists = [
            search_within(
                backend,
                query,
                session=session,
                k=self._depth * k,
                from_item=from_item,
                to_item=to_item,
                within=within,
                search=search,
            )
            for backend, search in (
                (self._keyword, self._keyword.search),
                (self._embedding, embedded),
            )
        ]
        return reciprocal_rank_fusion(lists, k=k, k_rrf=self._k_rrf, weights=self._weights)

    def count(self, session: str) -> int:
        return self._keyword.count(session)

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
            f"keyword_weight={self._weights[0]})"
        )
