"""Chooses a retrieval backend from one argument, so swapping backends is a one-word change."""

from __future__ import annotations

import importlib.util
from os import PathLike
from pathlib import Path

from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import VectorStore

from keeper_middleware.errors import ArgumentTypeError, ConfigurationError
from keeper_middleware.retrievers.base import Retriever
from keeper_middleware.retrievers.embedders import Embedder
from keeper_middleware.retrievers.embedding import DEFAULT_COLLECTION, EmbeddingRetriever
from keeper_middleware.retrievers.hybrid import HybridRetriever
from keeper_middleware.retrievers.keyword import KeywordRetriever
from keeper_middleware.retrievers.vectorstore import VectorStoreRetriever

BACKENDS = ("keyword", "embedding", "hybrid")
RetrieverSpec = Retriever | VectorStore | str | None
"""What ``retriever=`` takes: a retriever, any LangChain vector store, or a backend's name."""
KEYWORD_FILE = "keyword.sqlite3"
TANTIVY_FOLDER = "tantivy"
KEYWORD_ENGINES = ("auto", "fts5", "tantivy")
FTS5_LIMIT_BYTES = 32 << 20
"""Size of a folder's FTS5 file past which "auto" moves it to tantivy (see ``keyword_engine``):
about 95,000 one-line messages, where FTS5's search p95 reaches 10 ms of CPU while tantivy's is
4 ms; below it FTS5 adds a cut's passages for a third of tantivy's CPU and needs no dependency
(bench/results/index_cost.md, "Round four")."""
EMBEDDING_FOLDER = "chroma"


def make_retriever(
    spec: RetrieverSpec,
    *,
    path: str | PathLike[str] | None = None,
    embedder: Embedder | Embeddings | None = None,
    namespace: str | None = None,
    database: str | None = None,
    schema: str = "keeper",
    vectors_may_lag: bool = False,
    keyword_engine: str = "auto",
) -> Retriever:
    """A retriever from a spec: a retriever passes through, a LangChain ``VectorStore`` is
    adapted (:class:`VectorStoreRetriever`); "keyword" (the default, also for None),
    "embedding" or "hybrid" store their files in the folder ``path`` (in memory when None);
    "embedding+http://host:port" and "hybrid+http://host:port" use a Chroma server.
    ``embedder`` replaces the default model (all-MiniLM-L6-v2) of the embedding backends.
    ``namespace`` names the server's collection, so apps and tenants sharing one Chroma server
    never read each other's passages (the keeper passes one per archive); without it the shared
    default collection is used.
    With ``database`` (a ``postgresql://`` URL) the keyword side lives in that database, in
    ``schema``, instead of a file: "keyword" and "hybrid" then need no local files ("hybrid"
    with a Chroma server). ``vectors_may_lag``: a "hybrid" search does not wait for vectors
    still being made; it ranks those passages by keyword until they are written (the keeper's
    choice, so a search right after a cut is not held up by embedding it).
    ``keyword_engine`` ranks the keyword side of a folder: "fts5" (SQLite, no dependency),
    "tantivy" (``pip install keeper-middleware[tantivy]``; stores each word's document frequency,
    so a search at millions of passages stays in milliseconds), or "auto": tantivy for a folder
    that has its index or whose FTS5 file has grown past ``FTS5_LIMIT_BYTES``, FTS5 otherwise
    (and always in memory, or when tantivy is not installed). Moved to tantivy, the folder's
    index is built again from the archive at the next search.
    """
    engine = _keyword_engine(keyword_engine, folder=None if path is None else Path(path))
    if spec is None:
        spec = "keyword"
    if not isinstance(spec, str):
        if isinstance(spec, Retriever):
            return spec
        if isinstance(spec, VectorStore):  # any LangChain store, behind the same protocol
            return VectorStoreRetriever(spec)
        raise ArgumentTypeError(
            f"retriever must be a Retriever or one of {', '.join(BACKENDS)}, "
            f"got {type(spec).__name__}."
        )
    backend, _, server = spec.strip().partition("+")
    backend = backend.lower()
    if backend not in BACKENDS or (server and backend == "keyword"):
        raise ConfigurationError(
            f"Unknown retriever {spec!r}: use 'keyword', 'embedding', 'hybrid', "
            "'embedding+http://host:port' or 'hybrid+http://host:port'."
        )
    folder = Path(path) if path is not None else None

    def keyword() -> Retriever:
        if database is not None:
            from keeper_middleware.retrievers.postgres_keyword import PostgresKeywordRetriever

            return PostgresKeywordRetriever(database, schema=schema)
        if engine == "tantivy":
            from keeper_middleware.retrievers.tantivy_keyword import TantivyKeywordRetriever

            return TantivyKeywordRetriever(folder / TANTIVY_FOLDER if folder else None)
        return KeywordRetriever(folder / KEYWORD_FILE if folder else ":memory:")

    if backend == "keyword":
        return keyword()
    embedding = EmbeddingRetriever(
        None if server or folder is None else folder / EMBEDDING_FOLDER,
        server=server or None,
        embedder=embedder,
        collection=namespace if server and namespace else DEFAULT_COLLECTION,
        # the dates a query names lift the embedding backend alone; in the hybrid the keyword
        # side matches them already, and doing it twice gained on no more than two of five
        # LoCoMo conversations (bench/results/locomo_recall.md, twelfth round)
        named_dates=backend == "embedding",
        # the embedding backend alone embeds a transcript turn's header once: +0.03 any@5 on
        # each of five LoCoMo conversations; the hybrid's embedding side keeps it twice, which
        # the fusion did better with (bench/results/locomo_recall_round13.md)
        vector_text=None if backend == "embedding" else "whole",
    )
    if backend == "embedding":
        return embedding
    return HybridRetriever(keyword(), embedding, wait_for_vectors=not vectors_may_lag)


def _keyword_engine(choice: str, *, folder: Path | None) -> str:
    """The engine ``keyword_engine`` names, "auto" resolved for the folder (see
    :func:`make_retriever`): measured in bench/results/index_cost.md ("Round four")."""
    if choice not in KEYWORD_ENGINES:
        raise ConfigurationError(
            f"keyword_engine={choice!r}; use one of {', '.join(KEYWORD_ENGINES)}"
        )
    if choice != "auto":
        return choice
    if folder is None:
        return "fts5"
    if (folder / TANTIVY_FOLDER).is_dir():
        return "tantivy"  # without tantivy installed, it says how to install it
    if importlib.util.find_spec("tantivy") is None:
        return "fts5"
    fts5 = folder / KEYWORD_FILE
    grown = fts5.exists() and fts5.stat().st_size > FTS5_LIMIT_BYTES
    return "tantivy" if grown else "fts5"
