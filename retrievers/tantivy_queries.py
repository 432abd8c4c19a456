"""The queries a tantivy keyword search sends: the question's terms, BM25-ranked, within the
session, items and branch asked for, common terms ranked only among the newest passages; and the
texts that follow the hits, read in one query.

What the terms are and which are common is decided in ``retrievers/tantivy_terms.py``; these
functions only spell it in tantivy's query language.
"""

from __future__ import annotations

from typing import Any

from keeper_middleware.retrievers.base import Spans
from keeper_middleware.retrievers.tantivy_terms import Term

_LARGEST = 2**63 - 1
Documents = list[tuple[float, dict[str, list[Any]]]]
"""Found documents with their scores, as ``tantivy.Document.to_dict`` gives them."""


def key(session: str, position: int) -> str:
    """A passage's key: its session and position (re-adding one replaces it)."""
    return f"{session}\x1f{position}"


def any_of(tantivy: Any, schema: Any, terms: list[Term]) -> Any:
    """Passages with any of the (field, word) terms, BM25-ranked (their scores summed)."""
    Query, Occur = tantivy.Query, tantivy.Occur  # noqa: N806
    return Query.boolean_query([(Occur.Should, Query.term_query(schema, f, w)) for f, w in terms])


def filtered(tantivy: Any, words: Any, filters: list[Any]) -> Any:
    """``words`` within the filters (a filter adds nothing to the score)."""
    if not filters:
        return words
    Query, Occur = tantivy.Query, tantivy.Occur  # noqa: N806
    return Query.boolean_query(
        [(Occur.Must, words)] + [(Occur.Must, Query.const_score_query(f, 0.0)) for f in filters]
    )


def newest_first_ranking(
    tantivy: Any, schema: Any, ranked: list[Term], common: list[Term], newest_from: int
) -> Any:
    """``ranked`` terms as ``any_of`` ranks them, except that a passage holding none but
    ``common`` ones is matched only from position ``newest_from`` on: a passage with a rarer
    term is ranked by all of its terms wherever it is, and no passage is scored twice."""
    Query, Occur = tantivy.Query, tantivy.Occur  # noqa: N806
    newest = Query.range_query(schema, "position", tantivy.FieldType.Integer, newest_from, _LARGEST)
    rare = [term for term in ranked if term not in common]
    recent: list[tuple[Any, Any]] = [
        (Occur.Must, any_of(tantivy, schema, common)),
        (Occur.Must, Query.const_score_query(newest, 0.0)),
    ]
    if not rare:
        return Query.boolean_query(recent)
    rarer = any_of(tantivy, schema, rare)
    anywhere = Query.boolean_query(
        [(Occur.Must, rarer)] + [(Occur.Should, Query.term_query(schema, f, w)) for f, w in common]
    )
    recent.append((Occur.MustNot, rarer))
    return Query.boolean_query(
        [(Occur.Should, anywhere), (Occur.Should, Query.boolean_query(recent))]
    )


def session_filters(
    tantivy: Any,
    schema: Any,
    session: str,
    from_item: int | None,
    to_item: int | None,
    within: Spans | None,
) -> list[Any]:
    """The session's passages, of the items and the branch's spans asked for."""
    Query, Integer = tantivy.Query, tantivy.FieldType.Integer  # noqa: N806
    filters = [Query.term_query(schema, "session", session)]
    if from_item is not None or to_item is not None:
        low = -(2**63) if from_item is None else from_item
        high = _LARGEST if to_item is None else to_item
        filters.append(Query.range_query(schema, "item", Integer, low, high))
    if within is not None:
        spans = [
            (tantivy.Occur.Should, Query.range_query(schema, "position", Integer, a, b - 1))
            for a, b in within.ranges
        ]
        filters.append(Query.boolean_query(spans))
    return filters


def following_texts(
    tantivy: Any,
    schema: Any,
    searcher: Any,
    found: tuple[str, Documents],
    within: Spans | None,
) -> dict[int, str]:
    """The text that follows each of the session's found documents, by the document's
    position, read in one search (the next position, or the next one within the spans)."""
    session, documents = found
    wanted: dict[int, int] = {}
    for _, document in documents:
        position = int(document["position"][0])
        following = position + 1 if within is None else within.following(position)
        if following is not None:
            wanted[following] = position
    if not wanted:
        return {}
    query = tantivy.Query.term_set_query(
        schema, "key", [key(session, following) for following in wanted]
    )
    texts: dict[int, str] = {}
    for _, address in searcher.search(query, limit=len(wanted), count=False).hits:
        document = searcher.doc(address).to_dict()
        texts[wanted[int(document["position"][0])]] = str(document["text"][0])
    return texts
