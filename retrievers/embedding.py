"""Semantic search: sentence embeddings in chromadb, indexed by a background worker.

Embedding is the cost of indexing (measured on 2 cores: about 8.3 ms of CPU a LoCoMo sentence or
message with all-MiniLM-L6-v2 in PyTorch, 2.7 ms with its int8 build ``minilm-q8``, against 0.25 ms
for everything else; bench/results/locomo_recall.md), so ``add`` only queues passages and
returns; the process's indexing worker (:mod:`~keeper_middleware.retrievers.background`, one
thread for every index of the process) embeds and writes them in batches while the agent waits
for its next model call. ``search`` first makes sure what is queued for its session is written,
so results are always complete: it writes the queue itself rather than wait behind other work
of the worker. ``flush`` and ``close`` write everything. The queue is bounded
(``MAX_QUEUED_PASSAGES``): an ``add`` past it writes the queue first.

A passage of several sentences (a whole message) gets a vector of its own and one per sentence,
all carrying the passage's context, and scores as the best of them: a message's mean-pooled vector
dilutes the one sentence a question is about, a lone sentence misses what the message around it
says, and measured on LoCoMo (bench/results/locomo_recall.md) the best of both finds more
evidence than either. A hit that a sentence's vector found marks that sentence.

The embedding model is passed explicitly everywhere (chromadb's default embedding function would
download a model), and it is recorded in the collection's metadata, so a folder indexed with one
embedder is never searched with vectors from another.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
import warnings
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from os import PathLike
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from langchain_core.embeddings import Embeddings

from keeper_middleware.errors import ConfigurationError, InvalidStateError
from keeper_middleware.retrievers.background import background_worker
from keeper_middleware.retrievers.base import (
    Hit,
    IndexingFailedError,
    Passage,
    ServerUnavailableError,
    Spans,
    check_search_arguments,
)
from keeper_middleware.retrievers.chroma_folder import set_aside_if_damaged, writing
from keeper_middleware.retrievers.embedders import (
    Embedder,
    MiniLMEmbedder,
    as_embedder,
    calls_may_overlap,
    embed_query,
    embedder_name,
    import_chromadb,
    keeper_embedding_function,
)
from keeper_middleware.retrievers.named_context import POOL, fuse_pool, named_times
from keeper_middleware.retrievers.passages import best_sentence, mark_hits
from keeper_middleware.retrievers.sentences import (
    has_searchable_text,
    long_sentences,
    sentence_groups,
    split_sentences,
)
from keeper_middleware.retrievers.vector_text import (
    DEFAULT_VECTOR_TEXT,
    VECTOR_TEXTS,
    vector_text,
)

logger = logging.getLogger(__name__)

DEFAULT_COLLECTION = "keeper-passages"
_EMBED_BATCH = 16
"""Texts a model call embeds in the background: small, so a search waits little for the batch
in flight (the worker pauses between batches while a search runs), and no dearer than 64 (both
18 ms of CPU a chat message with MiniLM, bench/results/index_cost.md)."""
_UPSERT_ROWS = 256
"""Vectors written to chroma at once. A query waits for a write under way (measured at 100K
passages: 1,600 vectors take 4.5-5.4 s to write on the loaded 2-core machine, 400 take 1.2 s,
100 take 0.5 s), and the worker pauses for searches only between writes."""
_OVERFETCH = 4
_GROW = 4
"""How much more to ask for when the nearest vectors held fewer than k passages."""
_MOST = 64
"""The most vectors per hit wanted asked for unfiltered before the session filter is used."""
_MIN, _MAX = -(2**63), 2**63 - 1
SENTENCE_WORDS = 1
"""Fewest words a sentence vector covers (1: every sentence with a word has its own)."""
MAX_QUEUED_PASSAGES = 20_000
"""Most passages queued for embedding; an ``add`` past it writes the queue before returning."""
SHORT_SENTENCES = ("join", "skip")
"""What a sentence of fewer than ``sentence_words`` words gets: a share of its neighbours'
vector, or no vector of its own."""


class EmbeddingRetriever:
    """Nearest-neighbour search over sentence embeddings stored in chromadb.

    ``path`` is a folder for a persistent index; ``server`` an ``http(s)://host:port`` URL of a
    Chroma server; with neither, the index lives in memory and is gone when closed.
    """

    counts_stored = True
    """``count`` reads the index (so a deleted one is rebuilt: ``indexing.reconcile``)."""

    def __init__(
        self,
        path: str | PathLike[str] | None = None,
        *,
        server: str | None = None,
        embedder: Embedder | Embeddings | None = None,
        collection: str = DEFAULT_COLLECTION,
        batch_size: int = _EMBED_BATCH,
        min_score: float | None = None,
        sentence_vectors: bool = True,
        sentence_words: int = SENTENCE_WORDS,
        short_sentences: str = "join",
        sentence_context: bool = True,
        named_dates: bool = True,
        vector_text: str | None = None,
    ) -> None:
        """``min_score`` (a cosine similarity) turns nearest neighbours into matches: without it
        every passage is a result, so an archive search always reads as a list cut short.
        ``sentence_vectors`` also embeds each sentence of a passage of several (a message), so a
        passage scores as its best sentence or itself; off, a passage has one vector (indexing
        a message costs about half as much). ``sentence_words`` (1: a vector per sentence)
        and ``short_sentences`` give fewer sentence vectors: a sentence of fewer words joins
        its neighbours' vector ("join") or has none of its own ("skip"; the passage's vector
        still covers it). Both cost recall on LoCoMo or the benchmark's streams, so the
        default stays one vector per sentence (bench/results/locomo_recall.md).
        ``sentence_context=False`` embeds a sentence without the passage's context (measured:
        a quarter less work, and the embedding backend's LoCoMo recall falls by a third).
        ``named_dates``: when the query names a month or a year, the nearest passages dated in
        it rise among the candidates (``retrievers/named_context.py``).
        ``vector_text``: what a new index's vectors embed, ``context: text`` as indexed
        ("whole"), the header the text repeats from its context left out ("once", the default),
        or that and the context's time of day and item ("short"; ``retrievers/vector_text.py``).
        A collection records its form and keeps it, so its vectors never mix two forms (one made
        before the form was recorded is "whole"; asked for another, a warning says so).

        Raises:
            ConfigurationError: an unknown ``vector_text``.
        """
        if vector_text is not None and vector_text not in VECTOR_TEXTS:
            raise ConfigurationError(
                f"vector_text must be one of {', '.join(VECTOR_TEXTS)}, got {vector_text!r}."
            )
        self._named_dates = named_dates
        if sentence_words < 1:
            raise ConfigurationError(
                f"sentence_words must be a positive int (1: a vector per sentence), "
                f"got {sentence_words}."
            )
        if short_sentences not in SHORT_SENTENCES:
            raise ConfigurationError(
                f"short_sentences must be one of {', '.join(SHORT_SENTENCES)}, "
                f"got {short_sentences!r}."
            )
        self._sentence_vectors = sentence_vectors
        self._sentence_words = sentence_words
        self._short = short_sentences
        self._sentence_context = sentence_context
        if min_score is not None and not -1.0 <= min_score <= 1.0:
            raise ConfigurationError(
                f"min_score is a cosine similarity in [-1, 1], got {min_score}."
            )
        self._min_score = min_score
        if path is not None and server is not None:
            raise ConfigurationError(
                "Give either path (a local folder) or server (a URL), not both."
            )
        if batch_size < 1:
            raise ConfigurationError(f"batch_size must be a positive int, got {batch_size}.")
        self._embedder: Embedder = (
            as_embedder(embedder) if embedder is not None else MiniLMEmbedder()
        )
        self._name = embedder_name(self._embedder)
        self._batch_size = batch_size
        self._ephemeral = path is None and server is None
        self._where = f"server {server}" if server else (str(path) if path else "memory")
        self._folder = Path(path).resolve() if path is not None and server is None else None
        """The local folder, whose writes stand a marker (``retrievers/chroma_folder.py``)."""
        self._client = _make_client(path, server)
        collection_name = _collection_name(collection, ephemeral=self._ephemeral)
        self._collection = self._client.get_or_create_collection(
            collection_name,
            embedding_function=keeper_embedding_function(self._embedder),
            configuration={"hnsw": {"space": "cosine"}},
            metadata={"embedder": self._name, "vector_text": vector_text or DEFAULT_VECTOR_TEXT},
        )
        held = self._collection.metadata or {}
        stored = held.get("embedder")
        if stored not in (None, self._name):
            raise ConfigurationError(
                f"The collection {collection_name!r} at {self._where} was indexed with embedder "
                f"{stored!r}, not {self._name!r}: open it with the same embedder, or use another "
                "folder or collection name."
            )
        self._vector_text = str(held.get("vector_text", "whole"))
        if vector_text not in (None, self._vector_text):
            logger.warning(
                "The collection %r at %s embeds the %r form of its passages; it keeps it (asked "
                "for %r: use another folder or collection name, or delete this index so that "
                "it is rebuilt from the archive).",
                collection_name,
                self._where,
                self._vector_text,
                vector_text,
            )
        self._max_batch = int(self._client.get_max_batch_size())
        self._queue: deque[Passage] = deque()
        self._pending: Counter[str] = Counter()
        self._changed = threading.Condition()
        self._model_lock = threading.Lock()
        self._query_lock: contextlib.AbstractContextManager[object] = (
            contextlib.nullcontext() if calls_may_overlap(self._embedder) else self._model_lock
        )
        """What a query's embedding holds: nothing when the embedder takes overlapping calls, so
        a search right after a cut does not wait for a batch of the cut's vectors (measured:
        1.5 s p50, 5.5 s p95 at 10K messages, bench/results/index_cost.md)."""
        self._draining = threading.Lock()
        self._failure: BaseException | None = None
        self._closed = False
        self._worker = background_worker()
        self._job = _WriteJob(self)

    def add(self, passages: Sequence[Passage]) -> None:
        if not passages:
            return
        with self._changed:
            self._check_usable()
            self._queue.extend(passages)
            self._pending.update(p.session for p in passages)
            crowded = len(self._queue) > MAX_QUEUED_PASSAGES
            self._changed.notify_all()
        if crowded:
            self._wait(None)
        else:
            self._worker.submit(self._job, self._drain)

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
        with self._worker.foreground():
            self._wait(session)
            return self.search_written(
                query, session=session, k=k, from_item=from_item, to_item=to_item, within=within
            )

    def search_written(
        self,
        query: str,
        *,
        session: str,
        k: int = 10,
        from_item: int | None = None,
        to_item: int | None = None,
        within: Spans | None = None,
    ) -> list[Hit]:
        """:meth:`search` over the passages written so far, without waiting for those still
        queued (a hybrid ranks those by its keyword side meanwhile)."""
        check_search_arguments(k, from_item, to_item)
        if not has_searchable_text(query) or (within is not None and not within):
            return []
        with self._changed:
            self._check_usable()
        with self._worker.foreground():
            return self._search_written(query, session, k, from_item, to_item, within)

    def _search_written(
        self,
        query: str,
        session: str,
        k: int,
        from_item: int | None,
        to_item: int | None,
        within: Spans | None,
    ) -> list[Hit]:
        with self._query_lock:
            vector = embed_query(self._embedder, query)
        deep = self._named_dates and bool(named_times(query))
        wanted = max(k, POOL) if deep else k
        found = self._nearest(list(vector), wanted, session, from_item, to_item, within)
        texts = self._passage_texts(session, found)
        passages = {
            position: Passage(
                session=session,
                item=int(meta["item"]),
                position=position,
                text=texts.get(position, doc),
                context=str(meta.get("context", "")),
            )
            for position, (_, meta, doc, _) in found.items()
        }
        following = self._following(session, list(passages.values()), within)
        hits: list[Hit] = []
        marked: list[Hit] = []
        for position, (distance, _, document, sentence) in found.items():
            score = 1.0 - float(distance)
            if self._min_score is not None and score < self._min_score:
                continue
            if sentence is not None:  # a group of sentences: its best one is marked
                sentence += best_sentence(document, query)
            hit = Hit(
                passage=passages[position],
                score=score,
                next_text=following.get(position, ""),
                sentence=sentence if sentence is not None else 0,
            )
            (hits if sentence is not None else marked).append(hit)
        ranked = hits + mark_hits(marked, query)  # a sentence's own vector already marks it
        ranked.sort(key=lambda h: (-h.score, -h.passage.position))
        return fuse_pool(query, ranked, k=k, speakers=False) if deep else ranked

    def count(self, session: str) -> int:
        self._wait(session)
        ids = self._collection.get(where={"session": session}, include=[])["ids"]
        return sum(1 for vector_id in ids if _is_passage_id(vector_id))

    def delete_session(self, session: str) -> None:
        self._wait(session)
        with self._writing():
            self._collection.delete(where={"session": session})

    def flush(self) -> None:
        self._wait(None)

    def close(self) -> None:
        if self._closed:
            return
        try:
            self.flush()
        finally:
            with self._changed:
                self._closed = True
                self._changed.notify_all()
            if self._ephemeral:
                self._client.delete_collection(self._collection.name)

    def __repr__(self) -> str:
        return f"EmbeddingRetriever({self._where}, embedder={self._name!r})"

    def _wait(self, session: str | None) -> None:
        """Returns once nothing is queued for ``session`` (or nothing at all). The caller writes
        the session's queued passages itself, between two of the worker's batches, rather than
        wait behind other sessions' work; ``None`` runs or waits for the whole queue."""
        while True:
            with self._changed:
                self._check_usable()
                left = self._pending[session] if session is not None else len(self._queue)
                if not left:
                    return
            with self._worker.waiting_for_worker():  # it must not pause for this caller
                if session is None:
                    self._worker.run_now(self._job)
                    with self._draining:  # a batch another thread took out of the queue
                        pass
                    continue
                with self._draining:
                    with self._changed:
                        mine = [p for p in self._queue if p.session == session]
                    if mine:
                        self._write_batch(mine, taken=True)

    def _drain(self) -> None:
        """Write what is queued, a batch at a time, until the queue is empty (a search may write
        its own session's passages between two batches)."""
        while True:
            with self._draining:
                with self._changed:
                    if not self._queue or self._failure is not None:
                        return
                    count = min(len(self._queue), self._max_batch)
                    batch = [self._queue[i] for i in range(count)]
                if not self._write_batch(batch, taken=False):
                    return

    def _write_batch(self, batch: list[Passage], *, taken: bool) -> bool:
        """Write ``batch`` and take it off the queue (the queue's first passages, or with
        ``taken`` wherever they are); a failure is kept for the next caller. Holds the write
        lock."""
        try:
            self._write(batch)
        except BaseException as error:  # kept and raised to the caller of the next call
            with self._changed:
                self._failure = error
                self._changed.notify_all()
            return False
        with self._changed:
            if taken:
                written = {id(p) for p in batch}
                self._queue = deque(p for p in self._queue if id(p) not in written)
            else:
                for _ in batch:
                    self._queue.popleft()
            self._pending.subtract(p.session for p in batch)
            self._changed.notify_all()
        return True

    def _write(self, batch: list[Passage]) -> None:
        latest = {(p.session, p.position): p for p in batch}  # the last add of a position wins
        unique = list(latest.values())
        self._drop_old_sentences(unique)
        rows = [row for p in unique for row in self._vector_rows(p)]
        vectors = self._embed_rows([text for _, text, _, _ in rows])
        chunk = min(self._max_batch, _UPSERT_ROWS)
        for start in range(0, len(rows), chunk):
            part = rows[start : start + chunk]
            self._worker.yield_to_foreground()
            with self._writing():
                self._collection.upsert(
                    ids=[vector_id for vector_id, _, _, _ in part],
                    embeddings=vectors[start : start + chunk],  # type: ignore[arg-type]
                    documents=[document for _, _, document, _ in part],
                    metadatas=[meta for _, _, _, meta in part],  # type: ignore[misc]
                )

    def _writing(self) -> contextlib.AbstractContextManager[None]:
        """The write marker of a local folder around one chroma write (a batch), so a process
        stopped in it leaves a sign the next one sees before chromadb reads the segment."""
        return contextlib.nullcontext() if self._folder is None else writing(self._folder)

    def _embed_rows(self, texts: list[str]) -> list[list[float]]:
        """The texts' vectors, embedded shortest first: a batch is padded to its longest text,
        and a message's vector and its sentences' differ several times in length, so batches
        of similar lengths cost far less (measured: 25.8 against 10.1 ms CPU a vector with MiniLM
        on LoCoMo's messages and sentences). Between batches the worker pauses while a search
        runs (``yield_to_foreground``); the model lock is taken per batch, so a query of an
        embedder that takes no overlapping calls waits for one batch at most."""
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        vectors: list[list[float]] = [[] for _ in texts]
        for start in range(0, len(order), self._batch_size):
            chosen = order[start : start + self._batch_size]
            self._worker.yield_to_foreground()
            with self._model_lock:
                made = self._embedder([texts[i] for i in chosen])
            for index, vector in zip(chosen, made, strict=True):
                vectors[index] = list(vector)
        return vectors

    def _vector_rows(self, passage: Passage) -> list[tuple[str, str, str, dict[str, Any]]]:
        """(id, text to embed, document, metadata) of the passage's vector and, when it holds
        several sentences, of each sentence's."""
        meta: dict[str, Any] = {
            "session": passage.session,
            "item": passage.item,
            "position": passage.position,
            "context": passage.context,
        }
        base = _passage_id(passage.session, passage.position)
        embedded = vector_text(passage.context, passage.text, self._vector_text)
        rows = [(base, embedded, passage.text, meta)]
        if not self._sentence_vectors:
            return rows
        sentences = split_sentences(passage.text)
        if self._short == "skip":
            groups = long_sentences(sentences, self._sentence_words) if len(sentences) > 1 else []
        else:
            groups = sentence_groups(sentences, self._sentence_words)
        if len(groups) > 1 or (self._short == "skip" and groups):
            for index, text in groups:
                context = passage.context if self._sentence_context else ""
                indexed = vector_text(context, text, self._vector_text)
                rows.append((f"{base}#{index}", indexed, text, {**meta, "sentence": index}))
        return rows

    def _drop_old_sentences(self, passages: list[Passage]) -> None:
        """A passage added again at a position it holds may have fewer sentences than before:
        its old sentence vectors go first (only re-adds pay for this look-up's result), one
        delete a session: a metadata filter reads every row's metadata, so at hundreds of
        thousands of vectors a delete a passage made a stopped build's next slice crawl."""
        ids = [_passage_id(p.session, p.position) for p in passages]
        held = self._collection.get(ids=ids, include=["metadatas"])
        positions: dict[str, list[int]] = {}
        for meta in held["metadatas"] or []:
            positions.setdefault(str(meta["session"]), []).append(int(meta["position"]))
        for session, held_positions in positions.items():
            with self._writing():
                self._collection.delete(
                    where={
                        "$and": [
                            {"session": session},
                            {"position": {"$in": held_positions}},
                            {"sentence": {"$gte": 0}},
                        ]
                    }
                )

    def _nearest(
        self,
        vector: list[float],
        k: int,
        session: str,
        from_item: int | None,
        to_item: int | None,
        within: Spans | None = None,
    ) -> dict[int, tuple[float, dict[str, Any], str, int | None]]:
        """The k nearest of the session's passages in the range (and ``within``), each at its
        best vector:
        position → (distance, metadata, document, the sentence whose vector it was or None).

        A metadata filter makes chroma read every row's metadata (measured: 47 ms CPU against
        2.6 ms unfiltered at 20K passages, growing with the collection), so the unfiltered
        neighbours are asked for first, ``_OVERFETCH`` times k of them, and kept when they hold
        at least k passages of the session and range (always, when a collection holds one
        archive and its passages few sentences); only otherwise is the filtered search run.
        """
        low = _MIN if from_item is None else from_item
        high = _MAX if to_item is None else to_item
        wanted = _OVERFETCH * k
        while True:
            rows, complete = self._query(vector, wanted, None)
            kept = [
                row
                for row in rows
                if row[1].get("session") == session
                and low <= int(row[1]["item"]) <= high
                and (within is None or int(row[1]["position"]) in within)
            ]
            best = _best_per_passage(kept)
            # several vectors of one passage (its sentences') took the places: ask for more
            # unfiltered, as long as the filter is not what leaves too few
            if len(best) >= k or complete or len(kept) < len(rows) or wanted >= _MOST * k:
                break
            wanted *= _GROW
        if len(best) < k and not complete:
            where = _where(session, from_item, to_item, within)
            while True:
                rows, complete = self._query(vector, wanted, where)
                best = _best_per_passage(rows)
                if len(best) >= k or complete:
                    break
                wanted *= _GROW
        ordered = sorted(best.items(), key=lambda pair: pair[1][0])[:k]
        return dict(ordered)

    def _query(
        self, vector: list[float], n: int, where: dict[str, Any] | None
    ) -> tuple[list[tuple[float, dict[str, Any], str]], bool]:
        """The n nearest vectors (distance, metadata, document), and whether that was all."""
        fields = ["documents", "metadatas", "distances"]
        result = self._collection.query(
            query_embeddings=[vector], n_results=n, where=where, include=fields
        )
        docs, metas, dists = (list(result[key][0]) for key in fields)  # type: ignore[index]
        rows = [(float(x), dict(m), str(d)) for d, m, x in zip(docs, metas, dists, strict=True)]
        return rows, len(rows) < n

    def _passage_texts(
        self, session: str, found: dict[int, tuple[float, dict[str, Any], str, int | None]]
    ) -> dict[int, str]:
        """The whole text of each passage a sentence's vector found (its document is the
        sentence alone)."""
        wanted = [position for position, row in found.items() if row[3] is not None]
        if not wanted:
            return {}
        got = self._collection.get(
            ids=[_passage_id(session, p) for p in wanted], include=["documents", "metadatas"]
        )
        return {
            int(meta["position"]): doc
            for meta, doc in zip(got["metadatas"] or [], got["documents"] or [], strict=True)
        }

    def _following(
        self, session: str, passages: list[Passage], within: Spans | None = None
    ) -> dict[int, str]:
        """position → the text of the passage that follows it (within ``within``: the next one
        of the same branch)."""
        if not passages:
            return {}
        nexts: dict[int, int] = {}
        for p in passages:
            following = p.position + 1 if within is None else within.following(p.position)
            if following is not None:
                nexts[following] = p.position
        if not nexts:
            return {}
        ids = [_passage_id(session, position) for position in nexts]
        got = self._collection.get(ids=ids, include=["documents", "metadatas"])
        return {
            nexts[int(meta["position"])]: doc
            for meta, doc in zip(got["metadatas"] or [], got["documents"] or [], strict=True)
        }

    def _check_usable(self) -> None:
        if self._closed:
            raise InvalidStateError(f"{self!r} is closed; make a new one to search again.")
        self._raise_failure()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise IndexingFailedError(
                f"Indexing in the background failed ({self._failure!r}); the passages still "
                f"queued ({len(self._queue)}) were not indexed. Fix the cause and add them again."
            ) from self._failure


def _passage_id(session: str, position: int) -> str:
    return f"{session}:{position}"


def _is_passage_id(vector_id: str) -> bool:
    """A passage's own vector (``session:position``), not one of its sentences'
    (``session:position#index``)."""
    return "#" not in vector_id.rpartition(":")[2]


def _best_per_passage(
    rows: Iterable[tuple[float, dict[str, Any], str]],
) -> dict[int, tuple[float, dict[str, Any], str, int | None]]:
    """Each passage once, at its nearest vector (the passage's own or one of its sentences')."""
    best: dict[int, tuple[float, dict[str, Any], str, int | None]] = {}
    for distance, meta, doc in rows:
        position = int(meta["position"])
        if position not in best or distance < best[position][0]:
            sentence = meta.get("sentence")
            best[position] = (distance, meta, doc, None if sentence is None else int(sentence))
    return best


def _where(
    session: str, from_item: int | None, to_item: int | None, within: Spans | None = None
) -> dict[str, Any]:
    clauses: list[dict[str, Any]] = [{"session": session}]
    if from_item is not None:
        clauses.append({"item": {"$gte": from_item}})
    if to_item is not None:
        clauses.append({"item": {"$lte": to_item}})
    if within is not None:
        clauses.append(spans_where(within))
    return clauses[0] if len(clauses) == 1 else {"$and": clauses}


def spans_where(within: Spans) -> dict[str, Any]:
    """A chroma ``where`` clause that keeps positions within the spans."""
    ranges: list[dict[str, Any]] = [
        {"$and": [{"position": {"$gte": start}}, {"position": {"$lt": end}}]}
        for start, end in within.ranges
    ]
    return ranges[0] if len(ranges) == 1 else {"$or": ranges}


def _collection_name(name: str, *, ephemeral: bool) -> str:
    """Checks chroma's naming rule up front; in-memory indexes get a private name each."""
    full = f"{name}-{uuid.uuid4().hex[:12]}" if ephemeral else name
    allowed = all(ch.isascii() and (ch.isalnum() or ch in "._-") for ch in full)
    if not 3 <= len(full) <= 512 or not allowed or not full[0].isalnum() or not full[-1].isalnum():
        raise ConfigurationError(
            f"Collection name {name!r} is not allowed: use 3-512 characters of letters, digits, "
            "'.', '_' and '-', starting and ending with a letter or digit."
        )
    return full


def _make_client(path: str | PathLike[str] | None, server: str | None) -> Any:
    chromadb = import_chromadb()
    settings = chromadb.config.Settings(anonymized_telemetry=False)
    if server is None:
        if path is None:
            return chromadb.EphemeralClient(settings=settings)
        set_aside_if_damaged(Path(path))  # chromadb's native code would crash reading it
        Path(path).mkdir(parents=True, exist_ok=True)
        return chromadb.PersistentClient(path=str(path), settings=settings)
    parts = urlsplit(server)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(
            f"server must be a URL like http://127.0.0.1:8000, got {server!r}."
        )
    port = parts.port or (443 if parts.scheme == "https" else 8000)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            client = chromadb.HttpClient(
                host=parts.hostname, port=port, ssl=parts.scheme == "https", settings=settings
            )
        client.heartbeat()
    except Exception as error:
        raise ServerUnavailableError(
            f"No Chroma server answered at {server} ({error}). Start one with "
            f"`chroma run --path DIR --host {parts.hostname} --port {port}`, or drop server= "
            "to keep the index in a local folder."
        ) from error
    return client


class _WriteJob:
    """The name of one index's write job on the process's worker (one queued at a time)."""

    __slots__ = ("owner",)

    def __init__(self, owner: EmbeddingRetriever) -> None:
        self.owner = repr(owner)

    def __repr__(self) -> str:
        return f"write queue of {self.owner}"
