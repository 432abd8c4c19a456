"""Any LangChain ``VectorStore`` as a keeper retriever.

Every store LangChain integrates (in-memory, Chroma, FAISS, pgvector, Pinecone, ...) becomes one
argument away: ``Keeper(retriever=InMemoryVectorStore(embeddings))``. Passages go in as documents
with ``session``, ``item`` and ``position`` metadata under the id ``"<session>:<position>"``, so
re-adding a position replaces it and the sentence that follows a match is one ``get_by_ids`` away.

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

from keeper_middleware.retrievers.base import Hit, Passage, Spans, check_search_arguments
from keeper_middleware.retrievers.sentences import has_searchable_text

_FETCH_LIMIT = 10_000


def passage_id(session: str, position: int) -> str:
    return f"{session}:{position}"


class VectorStoreRetriever:
    """The ``Retriever`` protocol over a LangChain ``VectorStore`` (see the module docstring)."""

    def __init__(self, store: VectorStore) -> None:
        if not isinstance(store, VectorStore):
            raise TypeError(
                f"expected a LangChain VectorStore, got {type(store).__name__}; pass e.g. "
                "InMemoryVectorStore(embeddings) or Chroma(...)"
            )
        self.store = store
        self._dialect = _dialect_of(store)
        self._lock = threading.Lock()
        self._added: dict[str, set[int]] = {}

    def add(self, passages: Sequence[Passage]) -> None:
        if not passages:
            return
        latest = {passage_id(p.session, p.position): p for p in passages}  # last one wins
        ids = list(latest)
        with self._lock:
            self.store.add_texts(
                [p.text for p in latest.values()],
                metadatas=[
                    {"session": p.session, "item": p.item, "position": p.position}
                    for p in latest.values()
                ],
                ids=ids,
            )
            for passage in latest.values():
                self._added.setdefault(passage.session, set()).add(passage.position)

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
        with self._lock:
            scored = self._dialect.search(self.store, query, k, session, from_item, to_item, within)
        hits = []
        for document, score in scored:
            passage = _passage(document)
            position = (
                passage.position + 1 if within is None else within.following(passage.position)
            )
            following = (
                [] if position is None else self.store.get_by_ids([passage_id(session, position)])
            )
            hits.append(
                Hit(
                    passage=passage,
                    score=float(score),
                    next_text=following[0].page_content if following else "",
                )
            )
        return hits

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

    def count(self, store: VectorStore, session: str, added: set[int]) -> int:
        return len(added)

    def delete(self, store: VectorStore, session: str, added: set[int]) -> None:
        if added:
            store.delete(ids=[passage_id(session, p) for p in added])


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

    def count(self, store: VectorStore, session: str, added: set[int]) -> int:
        return len(self._ids(store, session))

    def delete(self, store: VectorStore, session: str, added: set[int]) -> None:
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

    def count(self, store: VectorStore, session: str, added: set[int]) -> int:
        got = store.get(where={"session": session}, include=[])  # type: ignore[attr-defined]
        return len(got["ids"])

    def delete(self, store: VectorStore, session: str, added: set[int]) -> None:
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
    meta = document.metadata
    return Passage(
        session=str(meta["session"]),
        item=int(meta["item"]),
        position=int(meta["position"]),
        text=document.page_content,
    )
