"""Retrieval backends behind one ``Retriever`` protocol.

The keyword backend needs nothing beyond the standard library; the embedding and hybrid backends
import sentence-transformers and chromadb only when one is made.
"""

from keeper_middleware.retrievers.base import (
    CountingRetriever,
    Hit,
    MissingExtraError,
    Passage,
    Retriever,
    RetrieverError,
    ServerUnavailableError,
    search_and_count,
)
from keeper_middleware.retrievers.embedders import (
    EMBEDDERS,
    E5SmallEmbedder,
    Embedder,
    HashingEmbedder,
    MiniLMEmbedder,
    OnnxMiniLMEmbedder,
    embedder_from_name,
)
from keeper_middleware.retrievers.embedding import EmbeddingRetriever
from keeper_middleware.retrievers.factory import make_retriever
from keeper_middleware.retrievers.hybrid import HybridRetriever, reciprocal_rank_fusion
from keeper_middleware.retrievers.keyword import KeywordRetriever
from keeper_middleware.retrievers.passages import (
    PASSAGE_UNITS,
    excerpt,
    passages_from_message,
    passages_of,
)
from keeper_middleware.retrievers.sentences import passages_from_text, split_sentences
from keeper_middleware.retrievers.vectorstore import VectorStoreRetriever

__all__ = [
    "EMBEDDERS",
    "PASSAGE_UNITS",
    "CountingRetriever",
    "E5SmallEmbedder",
    "Embedder",
    "EmbeddingRetriever",
    "HashingEmbedder",
    "Hit",
    "HybridRetriever",
    "KeywordRetriever",
    "MiniLMEmbedder",
    "MissingExtraError",
    "OnnxMiniLMEmbedder",
    "Passage",
    "Retriever",
    "RetrieverError",
    "ServerUnavailableError",
    "VectorStoreRetriever",
    "embedder_from_name",
    "excerpt",
    "make_retriever",
    "passages_from_message",
    "passages_from_text",
    "passages_of",
    "reciprocal_rank_fusion",
    "search_and_count",
    "split_sentences",
]
