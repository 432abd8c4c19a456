"""Any LangChain ``VectorStore`` as a keeper retriever.

Every store LangChain integrates (in-memory, Chroma, FAISS, pgvector, Pinecone, ...) becomes one
argument away: ``Keeper(retriever=InMemoryVectorStore(embeddings))``. Passages go in as documents
with ``session``, ``item`` and ``position`` metadata under the id ``"<session>:<position>"``, so
re-adding a position replaces it and the sentence that follows a match is one ``get_by_ids`` away.
A passage with a context (who wrote it, when) is embedded with it; the words alone are kept in
the ``text`` metadata, and a hit shows them.

Stores filter and count in dialects of their own. Two are known: LangChain's
``InMemoryVectorStore`` (a Python predicate) and Chroma (a ``where`` clause, with counting and
deleting by metadata). Any other store is searched with growing over-fetching and filtered here,
and counts and deletes the passages added through this adapter in this process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.documents import Document
from langchain_core.vectorstores import InMemoryVectorStore, VectorStore

from keeper_middleware.errors import ArgumentTypeError
from keeper_middleware.retrievers.base import Hit, Passage, Spans, check_search_arguments
from keeper_middleware.retrievers.passages import mark_hits
from keeper_middleware.retrievers.sentences import has_searchable_text, split_sentences

_FETCH_LIMIT = 10_000


def passage_id(session: str, position: int) -> str:
    return f"{session}:{position}"


class VectorStoreRetriever:
    """The ``Retriever`` protocol over a LangChain ``VectorStore`` (see the module docstring)."""

    def __init__(self, store: VectorStore) -> None:
        if not isinstance(store, VectorStore):
            raise ArgumentTypeError(
                f"expected a LangChain VectorStore, got {type(store).__name__}; pass e.g. "
                "InMemoryVectorStore(embeddings) or Chroma(...)"
            )
        self.store = store
        self._dialect = _dialect_of(store)
        self._lock = threading.Lock()
        self._added: dict[str, set[str]] = {}
        """Per session, the ids' part after the session (``position`` or ``position#sentence``)."""

    def add(self, passages: Sequence[Passage]) -> None:
        if not passages:
            return
        latest = {passage_id(p.session, p.position): p for p in passages}  # last one wins
        ids: list[str] = []
        texts: list[str] = []
        metadatas: list[dict[str, Any]] = []
        for vector_id, passage in latest.items():
            meta = {
                "session": passage.session,
                "item": passage.item,
                "position": passage.position,
                "text": passage.text,
                "context": passage.context,
            }
            ids.append(vector_id)
            texts.append(passage.indexed_text)
            metadatas.append(meta)
            sentences = split_sentences(passage.text)
            if len(sentences) > 1:  # a message also has one document a sentence (its best wins)
                for index, sentence in enumerate(sentences):
                    ids.append(f"{vector_id}#{index}")
                    texts.append(f"{passage.context}: {sentence}" if passage.context else sentence)
                    metadatas.append({**meta, "sentence": index})
        with self._lock:
            self.store.add_texts(texts, metadatas=metadatas, ids=ids)
            for vector_id in ids:
                session, _, position = vector_id.rpartition(":")
                self._added.setdefault(session, set()).add(position)

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
        if not has_searchable_text(query) or (within is not None and not within):
            return []
        best: dict[int, tuple[Document, float]] = {}
        fetch = k
        with self._lock:
            while True:  # a message's sentences take several places: ask for more until k
                scored = self._dialect.search(
                    self.store, query, fetch, session, from_item, to_item, within
                )
                best = {}
                for document, score in scored:
                    position = int(document.metadata["position"])
                    if position not in best or score > best[position][1]:
                        best[position] = (document, score)
                if len(best) >= k or len(scored) < fetch or fetch >= _FETCH_LIMIT:
                    break
                fetch *= 4
        ranked = sorted(best.values(), key=lambda pair: -pair[1])[:k]
        hits: list[Hit] = []
        marked: list[Hit] = []
        for document, score in ranked:
            passage = _passage(document)
            next_at = passage.position + 1 if within is None else within.following(passage.position)
            following = (
                [] if next_at is None else self.store.get_by_ids([passage_id(session, next_at)])
            )
            sentence = document.metadata.get("sentence")
            hit = Hit(
                passage=passage,
                score=float(score),
                next_text=_passage(following[0]).text if following else "",
                sentence=int(sentence) if sentence is not None else 0,
            )
            (hits if sentence is not None else marked).append(hit)
        found = {h.passage.position: h for h in [*hits, *mark_hits(marked, query)]}
        return [found[int(document.metadata["position"])] for document, _ in ranked]

    def count(self, session: str) -> int:
        with self._lock:
            return self._dialect.count(self.store, session, self._added.get(session, set()))

    def delete_session(self, session: str) -> None:
        with self._lock:
            self._dialect.delete(self.store, session, self._added.pop(session, set()))

    def flush(self) -> None:
        """Stores write on ``add``; nothing waits."""

    def close(self) -> None:
        """The store belongs to the caller, who closes it."""


Scored = list[tuple[Document, float]]


class _Dialect:
    """How one kind of store filters, counts and deletes; the base filters here."""

    def search(
        self,
        store: VectorStore,
        query: str,
        k: int,
        session: str,
        from_item: int | None,
        to_item: int | None,
        within: Spans | None = None,
    ) -> Scored:
        keep = _predicate(session, from_item, to_item, within)
        fetch = max(4 * k, 32)
        while True:
            found = store.similarity_search_with_relevance_scores(query, k=fetch)
            kept = [(d, s) for d, s in found if keep(d)]
            if len(kept) >= k or len(found) < fetch or fetch >= _FETCH_LIMIT:
                return kept[:k]
            fetch *= 4

    def count(self, store: VectorStore, session: str, added: set[str]) -> int:
        return sum(1 for position in added if "#" not in position)

    def delete(self, store: VectorStore, session: str, added: set[str]) -> None:
        if added:
            store.delete(ids=[f"{session}:{p}" for p in added])


class _InMemory(_Dialect):
    def search(
        self,
        store: VectorStore,
        query: str,
        k: int,
        session: str,
        from_item: int | None,
        to_item: int | None,
        within: Spans | None = None,
    ) -> Scored:
        keep = _predicate(session, from_item, to_item, within)
        return store.similarity_search_with_score(query, k=k, filter=keep)

    def _ids(self, store: VectorStore, session: str) -> list[str]:
        records: dict[str, Any] = getattr(store, "store", {})
        return [i for i, r in records.items() if r.get("metadata", {}).get("session") == session]

    def count(self, store: VectorStore, session: str, added: set[str]) -> int:
        return sum(1 for i in self._ids(store, session) if "#" not in i.rpartition(":")[2])

    def delete(self, store: VectorStore, session: str, added: set[str]) -> None:
        ids = self._ids(store, session)
        if ids:
            store.delete(ids=ids)


class _Chroma(_Dialect):
    def search(
        self,
        store: VectorStore,
        query: str,
        k: int,
        session: str,
        from_item: int | None,
        to_item: int | None,
        within: Spans | None = None,
    ) -> Scored:
        clauses: list[dict[str, Any]] = [{"session": session}]
        if from_item is not None:
            clauses.append({"item": {"$gte": from_item}})
        if to_item is not None:
            clauses.append({"item": {"$lte": to_item}})
        if within is not None:
            ranges: list[dict[str, Any]] = [
                {"$and": [{"position": {"$gte": start}}, {"position": {"$lt": end}}]}
                for start, end in within.ranges
            ]
            clauses.append(ranges[0] if len(ranges) == 1 else {"$or": ranges})
        where = clauses[0] if len(clauses) == 1 else {"$and": clauses}
        found = store.similarity_search_with_score(query, k=k, filter=where)
        return [(document, -distance) for document, distance in found]  # higher is better

    def count(self, store: VectorStore, session: str, added: set[str]) -> int:
        got = store.get(where={"session": session}, include=[])  # type: ignore[attr-defined]
        return sum(1 for i in got["ids"] if "#" not in i.rpartition(":")[2])

    def delete(self, store: VectorStore, session: str, added: set[str]) -> None:
        ids = store.get(where={"session": session}, include=[])["ids"]  # type: ignore[attr-defined]
        if ids:
            store.delete(ids=ids)


def _dialect_of(store: VectorStore) -> _Dialect:
    if isinstance(store, InMemoryVectorStore):
        return _InMemory()
    if type(store).__name__ == "Chroma" and hasattr(store, "get"):
        return _Chroma()
    return _Dialect()


def _predicate(
    session: str, from_item: int | None, to_item: int | None, within: Spans | None = None
) -> Callable[[Document], bool]:
    def keep(document: Document) -> bool:
        meta = document.metadata
        if meta.get("session") != session:
            return False
        if within is not None and int(meta.get("position", -1)) not in within:
            return False
        item = int(meta.get("item", 0))
        return (from_item is None or item >= from_item) and (to_item is None or item <= to_item)

    return keep


def _passage(document: Document) -> Passage:
    """The passage a document holds (documents written before contexts hold the words alone)."""
    meta = document.metadata
    return Passage(
        session=str(meta["session"]),
        item=int(meta["item"]),
        position=int(meta["position"]),
        text=str(meta.get("text", document.page_content)),
        context=str(meta.get("context", "")),
    )
