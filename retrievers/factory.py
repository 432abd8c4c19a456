"""Chooses a retrieval backend from one argument, so swapping backends is a one-word change."""

from __future__ import annotations

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
    """
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
    )
    if backend == "embedding":
        return embedding
    return HybridRetriever(keyword(), embedding, wait_for_vectors=not vectors_may_lag)
