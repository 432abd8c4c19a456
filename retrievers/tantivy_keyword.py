"""BM25 keyword search over a tantivy index, for archives that outgrow SQLite FTS5.

FTS5's ``bm25()`` counts each query word's passages for its IDF on every search, by reading the
word's whole list: at a million sentences a search costs 35-55 ms however few hits it returns
(``bench/results/index_cost.md``). tantivy (a Lucene-like engine in Rust, ``pip install
keeper-middleware[tantivy]``) stores each word's document frequency in its index and ranks the
top hits with block-max WAND, skipping the passages that cannot enter them.

The passages themselves are stored in the index (text, context, item, position), so one commit
writes a batch whole or not at all; the archive stays the source of truth: a lost or deleted
index is built again from it (``search.indexing.reconcile``). A passage's key is its session and
position, so re-adding one replaces it. Words are cut as the FTS5 retriever's query words are
(letters and digits; ``domo86`` stays one word), lowercased, accents folded, and stemmed with the
Snowball English stemmer (FTS5's is Porter's: both take "recorded" to "record").

The query is what :class:`~keeper_middleware.retrievers.keyword.KeywordRetriever` ranks by: the
query's words less the stopwords (unless nothing else is left), each matched in the text and in
the context (speaker, date), their BM25 scores summed (k1=1.2, b=0.75, the same as FTS5's).
tantivy's IDF is ``ln(1 + (N - n + 0.5) / (n + 0.5))``: a word in most passages adds a little
rather than nothing.

A word a field holds in more than half the passages is not ranked by in that field (unless
nothing else is left): its newest matches only fill up a list still short, scored 0; a word in
more than 100,000 passages is ranked only among its newest matches, about 20,000 of them, unless
they are too few (``retrievers/tantivy_terms.py``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from os import PathLike
from pathlib import Path
from typing import Any

from keeper_middleware.errors import (
    ArchiveError,
    ConfigurationError,
    InvalidStateError,
    MissingDependencyError,
)
from keeper_middleware.retrievers.base import Hit, Passage, Spans, check_search_arguments
from keeper_middleware.retrievers.keyword import query_terms
from keeper_middleware.retrievers.named_context import POOL, fuse_pool, may_name
from keeper_middleware.retrievers.noise import useless_hit
from keeper_middleware.retrievers.passages import STOPWORDS, mark_hits
from keeper_middleware.retrievers.tantivy_queries import (
    any_of,
    filtered,
    following_texts,
    key,
    newest_first_ranking,
    session_filters,
)
from keeper_middleware.retrievers.tantivy_terms import (
    COMMON_PASSAGES,
    NEWEST_MATCHES,
    Terms,
    ranked_terms,
)

_STEMMED, _PLAIN = "keeper_stemmed", "keeper_plain"
_HEAP_BYTES = 50_000_000
_LOCK_WAIT_S = 10.0
_TIE_MARGIN = 2
"""Hits asked for beyond ``k`` a search, so equal scores are ordered newest first as FTS5 does."""


def _tantivy() -> Any:
    try:
        import tantivy
    except ImportError as error:
        raise MissingDependencyError(
            "tantivy", "tantivy", needed_by="the tantivy keyword engine"
        ) from error
    return tantivy


def _analyzer(tantivy: Any, *, stemming: bool) -> Any:
    builder = tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
    for step in (
        tantivy.Filter.remove_long(100),
        tantivy.Filter.lowercase(),
        tantivy.Filter.ascii_fold(),
    ):
        builder = builder.filter(step)
    if stemming:
        builder = builder.filter(tantivy.Filter.stemmer("english"))
    return builder.build()


def _schema(tantivy: Any, tokenizer: str) -> Any:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("key", stored=False, tokenizer_name="raw", index_option="basic")
    builder.add_text_field("session", stored=False, tokenizer_name="raw", index_option="basic")
    builder.add_integer_field("item", stored=True, indexed=True, fast=True)
    builder.add_integer_field("position", stored=True, indexed=True, fast=True)
    builder.add_text_field("text", stored=True, tokenizer_name=tokenizer)
    builder.add_text_field("context", stored=True, tokenizer_name=tokenizer)
    return builder.build()


_Found = list[tuple[float, Any]]
"""A search's hits: (score, the document's address)."""
_Stamp = tuple[int, int, int]


def _stamp(searcher: Any, generation: int) -> _Stamp:
    """What changes when the index does: a commit here, or its size or segments (another
    process wrote)."""
    return (generation, int(searcher.num_docs), int(searcher.num_segments))


def _best(found: list[tuple[float, Any]], count: int) -> list[tuple[float, Any]]:
    """The first ``count`` hits, and every hit that ties with the last of them."""
    if len(found) <= count:
        return found
    floor = found[count - 1][0]
    return [hit for hit in found if hit[0] >= floor]


def _hit(
    session: str, score: float, document: dict[str, list[Any]], following: dict[int, str]
) -> Hit:
    position = int(document["position"][0])
    return Hit(
        passage=Passage(
            session=session,
            item=int(document["item"][0]),
            position=position,
            text=str(document["text"][0]),
            context=str(document["context"][0]) if document.get("context") else "",
        ),
        score=float(score),
        next_text=following.get(position, ""),
    )


class TantivyKeywordRetriever:
    """BM25 keyword search over a tantivy index; incremental, persistent, safe across threads.

    Args:
        path: The index's folder (made when missing); None keeps the index in memory.
        stemming: Stem words (so "recorded" finds "record"); fixed when an index is made.
        stopwords: Words left out of a query unless nothing else is left.
        named_context: Rank higher the passages of the speakers, months and years a question
            names, as the FTS5 engine does (``retrievers/named_context.py``).
        common_passages: A word in more passages than this is ranked among its newest matches
            only (``retrievers/tantivy_terms.py``).
        newest_matches: About how many of its matches those newest passages hold.

    Raises:
        MissingDependencyError: tantivy is not installed.
        ConfigurationError: The folder holds an index made with the other stemming setting.
        ArchiveError: The folder holds something tantivy cannot open.
    """

    counts_stored = True
    """``count`` reads the index (so a deleted one is rebuilt: ``indexing.reconcile``)."""

    def __init__(
        self,
        path: str | PathLike[str] | None = None,
        *,
        stemming: bool = True,
        stopwords: frozenset[str] = STOPWORDS,
        named_context: bool = True,
        common_passages: int = COMMON_PASSAGES,
        newest_matches: int = NEWEST_MATCHES,
    ) -> None:
        tantivy = _tantivy()
        self._tantivy = tantivy
        self._path = None if path is None else Path(path)
        self._lock = threading.Lock()
        self._stopwords = stopwords
        self._named_context = named_context
        self._common = (common_passages, newest_matches)
        tokenizer = _STEMMED if stemming else _PLAIN
        self._schema = _schema(tantivy, tokenizer)
        try:
            if self._path is not None:
                self._path.mkdir(parents=True, exist_ok=True)
                self._check_tokenizer(tokenizer)
            self._index = tantivy.Index(
                self._schema, path=None if self._path is None else str(self._path)
            )
        except (OSError, ValueError) as error:
            raise ArchiveError(
                f"cannot open the keyword index {str(self._path)!r} ({error}); the archive "
                "beside it is untouched: move this folder away and the next search builds it "
                "again from the archive"
            ) from error
        self._analyzer = _analyzer(tantivy, stemming=stemming)
        self._index.register_tokenizer(tokenizer, self._analyzer)
        self._writer: Any = None
        self._generation = 0
        self._alone: dict[str, tuple[_Stamp, bool]] = {}
        self._dead: tuple[_Stamp, int] | None = None
        self._tops: dict[str, tuple[tuple[int, int], int]] = {}
        self._closed = False

    def add(self, passages: Sequence[Passage]) -> None:
        if not passages:
            return
        tantivy = self._tantivy
        with self._lock:
            self._check_open()
            writer = self._open_writer()
            try:
                for passage in passages:
                    writer.delete_documents_by_term("key", key(passage.session, passage.position))
                    writer.add_document(
                        tantivy.Document(
                            key=key(passage.session, passage.position),
                            session=passage.session,
                            item=passage.item,
                            position=passage.position,
                            text=passage.text,
                            context=passage.context,
                        )
                    )
                writer.commit()
            except BaseException:
                writer.rollback()
                raise
            self._index.reload()
            self._generation += 1
            self._tops_added(passages)

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
        return self._ranked(query, session, k, k, from_item, to_item, within)[0]

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
        up to ``limit``: the index ranks ``limit`` of them, only the ``k`` shown are read."""
        check_search_arguments(k, from_item, to_item)
        return self._ranked(query, session, k, limit, from_item, to_item, within)

    def _ranked(
        self,
        query: str,
        session: str,
        k: int,
        limit: int,
        from_item: int | None,
        to_item: int | None,
        within: Spans | None,
    ) -> tuple[list[Hit], int]:
        """The best ``k`` hits and how many of the best ``limit`` (at least ``k``) matched."""
        if within is not None and not within:
            return [], 0
        words = self._query_words(query)
        if not words:
            return [], 0
        deep = self._named_context and may_name(query)
        wanted = max(k, POOL) if deep else k
        unfiltered = from_item is None and to_item is None and within is None
        with self._lock:
            self._check_open()
            searcher = self._index.searcher()
            filters = (
                []
                if unfiltered and self._holds_only(searcher, session)
                else session_filters(
                    self._tantivy, self._schema, session, from_item, to_item, within
                )
            )
            common, newest = self._common
            terms = ranked_terms(searcher, words, common_passages=common, newest_matches=newest)
            collected = wanted + _TIE_MARGIN
            found = self._found(searcher, session, terms, filters, collected)
            documents = self._useful_documents(searcher, found, query, wanted)
            if len(documents) < wanted and collected == len(found) < limit:
                collected = limit  # the noise left it short: read deeper
                found = self._found(searcher, session, terms, filters, collected)
                documents = self._useful_documents(searcher, found, query, wanted)
            count = self._count(searcher, session, terms, filters, (found, collected), limit)
            following = following_texts(
                self._tantivy, self._schema, searcher, (session, documents), within
            )
            hits = [_hit(session, score, document, following) for score, document in documents]
        if deep:
            hits = fuse_pool(query, hits, k=k)
        return mark_hits(hits, query), count

    def _found(
        self, searcher: Any, session: str, terms: Terms, filters: list[Any], limit: int
    ) -> _Found:
        """The best ``limit`` matches of the ranked terms (the common ones ranked in the
        session's newest passages, everywhere when those hold fewer than ``limit`` matches),
        then the newest of the held-back ones, scored 0, while fewer than ``limit`` are
        found."""
        tantivy, schema = self._tantivy, self._schema
        found: _Found = []
        newest_from = self._top(searcher, session) + 1 - terms.window if terms.common else 0
        if newest_from > 0:
            newest = newest_first_ranking(tantivy, schema, terms.ranked, terms.common, newest_from)
            found = searcher.search(
                filtered(tantivy, newest, filters), limit=limit, count=False
            ).hits
        if len(found) < limit:
            everywhere = filtered(tantivy, any_of(tantivy, schema, terms.ranked), filters)
            found = searcher.search(everywhere, limit=limit, count=False).hits
        if terms.filler and len(found) < limit:
            filler = filtered(tantivy, any_of(tantivy, schema, terms.filler), filters)
            found += self._newest(searcher, filler, found, limit)
        return found

    def _count(
        self,
        searcher: Any,
        session: str,
        terms: Terms,
        filters: list[Any],
        collected: tuple[_Found, int],
        limit: int,
    ) -> int:
        """How many passages match, up to ``limit``, without collecting ``limit`` hits when
        the index says there are as many: a search that found fewer than it asked for found
        them all, and (unfiltered) a term's stored document frequency, less the deleted
        passages its segments may still count, is a lower bound."""
        found, asked = collected
        if len(found) >= limit:
            return limit
        if len(found) < asked:
            return len(found)
        if not filters:
            frequency = max(int(searcher.doc_freq(*term)) for term in terms.ranked + terms.filler)
            if frequency - self._deleted(searcher) >= limit:
                return limit
        return min(len(self._found(searcher, session, terms, filters, limit)), limit)

    def _useful_documents(
        self, searcher: Any, found: list[tuple[float, Any]], query: str, wanted: int
    ) -> list[tuple[float, dict[str, list[Any]]]]:
        """The best ``wanted`` documents, equal scores newest first as FTS5 orders them, less
        replies that say nothing and the asking question itself (``retrievers/noise.py``)."""
        documents: list[tuple[float, dict[str, list[Any]]]] = []
        taken = 0
        while len(documents) < wanted and taken < len(found):
            best = _best(found[taken:], wanted - len(documents) + _TIE_MARGIN)
            taken += len(best)
            batch = [(score, searcher.doc(address).to_dict()) for score, address in best]
            batch.sort(key=lambda pair: (-pair[0], -pair[1]["position"][0]))
            documents += [d for d in batch if not useless_hit(str(d[1]["text"][0]), query)]
        return documents[:wanted]

    def _newest(
        self, searcher: Any, query: Any, found: list[tuple[float, Any]], needed: int
    ) -> list[tuple[float, Any]]:
        """The newest matches of ``query`` not ``found`` already, scored 0, up to ``needed``
        hits in all: a common word's matches fill up a list still short, unranked."""
        seen = {(address.segment_ord, address.doc) for _, address in found}
        newest = searcher.search(query, limit=needed, count=False, order_by_field="position").hits
        more = [(0.0, a) for _, a in newest if (a.segment_ord, a.doc) not in seen]
        return more[: needed - len(found)]

    def count(self, session: str) -> int:
        with self._lock:
            self._check_open()
            searcher = self._index.searcher()
            query = self._tantivy.Query.term_query(self._schema, "session", session)
            return int(searcher.search(query, limit=1, count=True).count)

    def delete_session(self, session: str) -> None:
        with self._lock:
            self._check_open()
            writer = self._open_writer()
            writer.delete_documents_by_term("session", session)
            writer.commit()
            self._index.reload()
            self._generation += 1

    def flush(self) -> None:
        """Nothing to wait for: every add is committed before it returns."""

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                if self._writer is not None:
                    self._writer.wait_merging_threads()
                    self._writer = None

    def __repr__(self) -> str:
        return f"TantivyKeywordRetriever({str(self._path) if self._path else None!r})"

    def _query_words(self, query: str) -> list[str]:
        """The query's words as the index holds them (stemmed), stopwords left out unless
        nothing else is left, each once."""
        terms = query_terms(query)
        kept = [t for t in terms if t not in self._stopwords] or terms
        words: dict[str, None] = {}
        for term in kept:
            for token in self._analyzer.analyze(term):
                words.setdefault(token, None)
        return list(words)

    def _deleted(self, searcher: Any) -> int:
        """How many deleted passages the index's segments still count in their document
        frequencies (every passage has one session term), counted once a change."""
        stamp = _stamp(searcher, self._generation)
        if self._dead is None or self._dead[0] != stamp:
            held = sum(int(n) for _, n in searcher.terms_with_prefix("session", ""))
            self._dead = (stamp, held - int(searcher.num_docs))
        return self._dead[1]

    def _top(self, searcher: Any, session: str) -> int:
        """The session's newest position (-1: none), read from the index once and kept up to
        date by this retriever's adds; read again when the index's size changed otherwise
        (another process wrote, or a session was deleted)."""
        known = self._tops.get(session)
        size = (self._generation, int(searcher.num_docs))
        if known is not None and known[0] == size:
            return known[1]
        query = self._tantivy.Query.term_query(self._schema, "session", session)
        newest = searcher.search(query, limit=1, count=False, order_by_field="position").hits
        top = int(searcher.doc(newest[0][1]).to_dict()["position"][0]) if newest else -1
        self._tops[session] = (size, top)
        return top

    def _tops_added(self, passages: Sequence[Passage]) -> None:
        """Keep the known newest positions up to date with passages just committed."""
        if not self._tops:
            return
        size = (self._generation, int(self._index.searcher().num_docs))
        added: dict[str, int] = {}
        for passage in passages:
            added[passage.session] = max(added.get(passage.session, -1), passage.position)
        for session, (_, top) in list(self._tops.items()):
            self._tops[session] = (size, max(top, added.get(session, -1)))

    def _holds_only(self, searcher: Any, session: str) -> bool:
        """Whether every passage in the index is the session's (counted again after a commit
        here, or when the index's size or segments change: another process wrote). Then a
        search needs no session filter: a filter makes tantivy intersect the words' lists with
        the session's (every passage), where the words alone are ranked by block-max WAND,
        which skips what cannot reach the top (measured at 1M: 8.3 / 27.8 ms p50 / p95 with
        the filter, 4.6 / 13.0 without)."""
        stamp = _stamp(searcher, self._generation)
        known = self._alone.get(session)
        if known is not None and known[0] == stamp:
            return known[1]
        query = self._tantivy.Query.term_query(self._schema, "session", session)
        alone = int(searcher.search(query, limit=1, count=True).count) == int(searcher.num_docs)
        self._alone = {session: (stamp, alone)}
        return alone

    def _open_writer(self) -> Any:
        """The index's writer, opened on first write; another process writing the same folder
        holds its lock, waited for up to ``_LOCK_WAIT_S``."""
        if self._writer is not None:
            return self._writer
        deadline = time.monotonic() + _LOCK_WAIT_S
        while True:
            try:
                self._writer = self._index.writer(heap_size=_HEAP_BYTES, num_threads=1)
                return self._writer
            except ValueError as error:
                if time.monotonic() > deadline:
                    raise ArchiveError(
                        f"the keyword index {str(self._path)!r} is being written by another "
                        f"process ({error}); one process at a time may write an index"
                    ) from error
                time.sleep(0.05)

    def _check_tokenizer(self, tokenizer: str) -> None:
        assert self._path is not None
        meta = self._path / "meta.json"
        if not meta.exists():
            return
        other = _PLAIN if tokenizer == _STEMMED else _STEMMED
        if f'"{other}"' in meta.read_text():
            raise ConfigurationError(
                f"{self._path} was indexed with {other!r}, not {tokenizer!r}: open it with the "
                "stemming setting it was made with, or use another folder."
            )

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidStateError(f"{self!r} is closed; make a new one to search again.")
