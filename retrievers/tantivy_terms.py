"""Which of a question's words a tantivy search ranks by, read from the index's own counts.

A word a field holds in more than half the passages is not ranked by in that field, unless no
other word is in any passage, as the FTS5 engine does (``retrievers/keyword.py``): its IDF is
under ``ln 2`` where a word in one passage of eight has 2.1, yet its list is the longest a
search reads ("about" in every chat line of the benchmark: at 1M passages a search read 1M
postings for it, 8.3 / 10.5 ms CPU p50 / p95 against 3.2 / 4.2 without;
``bench/results/index_cost.md``, round five). Its newest matches only fill up a list still
short (:class:`~keeper_middleware.retrievers.tantivy_keyword.TantivyKeywordRetriever`).
"""

from __future__ import annotations

from typing import Any

SEARCHED_FIELDS = ("text", "context")
"""The fields a question's words are matched in: the passage's text and its speaker and date."""
USELESS_FRACTION = 0.5
"""A word a field holds in more than this share of the passages is not ranked by there."""

Term = tuple[str, str]
"""A (field, word) pair, the word as the index holds it (lowercased, stemmed)."""
Terms = tuple[list[Term], list[Term]]
"""The terms a search ranks by, and those held back to fill a short list."""


def ranked_terms(searcher: Any, words: list[str]) -> Terms:
    """The (field, word) terms of ``words`` to rank by, and those held back: a word a field
    holds in more than ``USELESS_FRACTION`` of the passages (tantivy's stored document
    frequency against the passages the searcher sees), unless no other term is in any passage.

    Args:
        searcher: A tantivy searcher over the index.
        words: The question's words as the index holds them.
    """
    terms = [(field, word) for word in words for field in SEARCHED_FIELDS]
    frequency = {term: int(searcher.doc_freq(*term)) for term in terms}
    ceiling = int(searcher.num_docs) * USELESS_FRACTION
    ranked = [term for term in terms if frequency[term] <= ceiling]
    if not any(frequency[term] for term in ranked):
        return terms, []
    return ranked, [term for term in terms if term not in ranked]
