"""Which of a question's words a tantivy search ranks by, and where, read from the index's counts.

A word a field holds in more than half the passages is not ranked by in that field, unless no
other word is in any passage, as the FTS5 engine does (``retrievers/keyword.py``): its IDF is
under ``ln 2`` where a word in one passage of eight has 2.1, yet its list is the longest a
search reads ("about" in every chat line of the benchmark: at 1M passages a search read 1M
postings for it, 8.3 / 10.5 ms CPU p50 / p95 against 3.2 / 4.2 without;
``bench/results/index_cost.md``, round five). Its newest matches only fill up a list still
short (:class:`~keeper_middleware.retrievers.tantivy_keyword.TantivyKeywordRetriever`).

A word in more than ``COMMON_PASSAGES`` passages is ranked only among the newest passages that
hold about ``NEWEST_MATCHES`` of its matches (of the commonest such word's, when several are),
as the FTS5 engine ranks only the newest 2,000 matches of every search; passages holding a rarer
word of the question are ranked by every word, wherever they are. Without it a search reads
every common word's whole list: at 10M chat lines, a word in one passage of eight is 1.25M
postings, and the benchmark's searches cost 35 / 46 ms CPU p50 / p95 (round five), where
tantivy's block-max WAND skips little because thousands of passages share the best score.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

SEARCHED_FIELDS = ("text", "context")
"""The fields a question's words are matched in: the passage's text and its speaker and date."""
USELESS_FRACTION = 0.5
"""A word a field holds in more than this share of the passages is not ranked by there."""
COMMON_PASSAGES = 100_000
"""A word in more passages than this is ranked among its newest matches only."""
NEWEST_MATCHES = 20_000
"""About how many of the commonest word's matches the newest passages ranked by it hold (ten
times the FTS5 engine's 2,000 candidates)."""

Term = tuple[str, str]
"""A (field, word) pair, the word as the index holds it (lowercased, stemmed)."""


class Terms(NamedTuple):
    """The terms a search ranks by, those held back to fill a short list, and those of the
    ranked ones that are ranked only in the session's newest ``window`` positions."""

    ranked: list[Term]
    filler: list[Term]
    common: list[Term]
    window: int


def ranked_terms(
    searcher: Any,
    words: list[str],
    *,
    common_passages: int = COMMON_PASSAGES,
    newest_matches: int = NEWEST_MATCHES,
) -> Terms:
    """The (field, word) terms of ``words`` to rank by, and those held back: a word a field
    holds in more than ``USELESS_FRACTION`` of the passages (tantivy's stored document
    frequency against the passages the searcher sees), unless no other term is in any passage;
    and which ranked ones are common, with the window they are ranked in.

    Args:
        searcher: A tantivy searcher over the index.
        words: The question's words as the index holds them.
        common_passages: A term in more passages than this is common.
        newest_matches: About how many of the commonest term's matches its window holds.
    """
    terms = [(field, word) for word in words for field in SEARCHED_FIELDS]
    frequency = {term: int(searcher.doc_freq(*term)) for term in terms}
    passages = int(searcher.num_docs)
    ceiling = passages * USELESS_FRACTION
    ranked = [term for term in terms if frequency[term] <= ceiling]
    if not any(frequency[term] for term in ranked):
        ranked = terms
    filler = [term for term in terms if term not in ranked]
    common = [term for term in ranked if frequency[term] > common_passages]
    if not common:
        return Terms(ranked, filler, [], 0)
    commonest = max(frequency[term] for term in common)
    return Terms(ranked, filler, common, newest_window(passages, commonest, newest_matches))


def newest_window(passages: int, matches: int, wanted: int) -> int:
    """How many of the newest positions hold about ``wanted`` of a word's ``matches`` in
    ``passages`` (its matches taken as spread evenly), at least ``wanted``."""
    return max(wanted, math.ceil(passages * wanted / max(matches, 1)))
