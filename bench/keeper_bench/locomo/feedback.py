"""Pseudo-relevance feedback for the keyword backend, as a benchmark option (``keyword:prf``).

A question often names the thing it asks about in other words than the turn that answers it
("What did Caroline research?" against "I've been looking into adoption agencies"). Feedback
assumes the first few hits are about the right topic: their most telling words (how often they
occur in those hits, times their IDF over the index; stop words and the query's own words left
out) are added to the query and it is run again. FTS5 has no per-term weight in ``MATCH``, so
the original terms are kept first by fusing the original ranking and the expanded one by
reciprocal rank (``fused=True``); ``fused=False`` returns the expanded ranking alone.

Measured in ``bench/results/locomo_recall.md`` (fifth round).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from keeper_bench.locomo.wrapping import WrappedRetriever
from keeper_middleware.retrievers.base import Hit, Passage, Spans
from keeper_middleware.retrievers.hybrid import reciprocal_rank_fusion
from keeper_middleware.retrievers.keyword import KeywordRetriever, query_terms
from keeper_middleware.retrievers.passages import STOPWORDS

_WORD = re.compile(r"\w+", re.UNICODE)
MIN_TERM_CHARS = 3
"""Shorter tokens ("ok", "2", "s") carry no topic."""


def expansion_terms(
    feedback: Iterable[str],
    *,
    query: str,
    document_frequency: Mapping[str, int],
    documents: int,
    terms: int,
    stopwords: frozenset[str] = STOPWORDS,
) -> list[str]:
    """The ``terms`` words of the feedback passages with the highest frequency in them times
    their BM25 IDF ``log((N - n + 0.5) / (n + 0.5))`` over the index (floored at 0, so a word in
    half the passages is never chosen); stop words, tokens shorter than ``MIN_TERM_CHARS``,
    words in no passage of the index and the query's own words are left out. Ties go to the
    word seen first, so the choice is the same on every run."""
    asked = set(query_terms(query))
    frequency: Counter[str] = Counter()
    for text in feedback:
        frequency.update(words(text))
    weights: dict[str, float] = {}
    for word, count in frequency.items():
        n = document_frequency.get(word, 0)
        if word in asked or word in stopwords or len(word) < MIN_TERM_CHARS or n == 0:
            continue
        idf = max(0.0, math.log((documents - n + 0.5) / (n + 0.5)))
        if idf > 0:
            weights[word] = count * idf
    order = sorted(weights, key=lambda word: -weights[word])
    return order[:terms]


def words(text: str) -> list[str]:
    """Lowercase word tokens, every occurrence (the keyword index's own split, before stemming)."""
    return _WORD.findall(text.lower())


class FeedbackKeywordRetriever(WrappedRetriever):
    """A ``KeywordRetriever`` whose searches are expanded by pseudo-relevance feedback.

    Document frequencies are counted from the passages added through it (their text, not the
    speaker and date of the context), which is every passage in the benchmark.
    """

    def __init__(
        self,
        inner: KeywordRetriever,
        *,
        feedback_docs: int = 5,
        feedback_terms: int = 5,
        fused: bool = True,
        depth: int = 2,
    ) -> None:
        if feedback_docs < 1 or feedback_terms < 1:
            raise ValueError(
                f"feedback_docs ({feedback_docs}) and feedback_terms ({feedback_terms}) must be "
                "at least 1: write prf=DOCS/TERMS, e.g. prf=5/5."
            )
        super().__init__(inner)
        self._docs = feedback_docs
        self._terms = feedback_terms
        self._fused = fused
        self._depth = depth
        self._frequency: Counter[str] = Counter()
        self._documents = 0

    def add(self, passages: Sequence[Passage]) -> None:
        self._inner.add(passages)
        for passage in passages:
            self._frequency.update(set(words(passage.text)))
        self._documents += len(passages)

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
        wide = max(k, self._docs) * self._depth
        first = self._inner.search(
            query, session=session, k=wide, from_item=from_item, to_item=to_item, within=within
        )
        added = expansion_terms(
            (hit.passage.text for hit in first[: self._docs]),
            query=query,
            document_frequency=self._frequency,
            documents=self._documents,
            terms=self._terms,
        )
        if not added:
            return first[:k]
        expanded = self._inner.search(
            f"{query} {' '.join(added)}",
            session=session,
            k=wide if self._fused else k,
            from_item=from_item,
            to_item=to_item,
            within=within,
        )
        if not self._fused:
            return expanded
        return reciprocal_rank_fusion([first, expanded], k=k)

    def expansion(self, query: str, *, session: str, to_item: int | None = None) -> list[str]:
        """The words a search for ``query`` would add (to see what feedback does)."""
        first = self._inner.search(query, session=session, k=self._docs, to_item=to_item)
        return expansion_terms(
            (hit.passage.text for hit in first),
            query=query,
            document_frequency=self._frequency,
            documents=self._documents,
            terms=self._terms,
        )

    def __repr__(self) -> str:
        return (
            f"FeedbackKeywordRetriever({self._inner!r}, feedback_docs={self._docs}, "
            f"feedback_terms={self._terms}, fused={self._fused})"
        )
