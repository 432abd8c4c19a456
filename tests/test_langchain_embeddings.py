"""A LangChain ``Embeddings`` is an embedder: the embedding backend indexes passages with its
``embed_documents``, searches with its ``embed_query``, and records its name so the folder is
never searched with another model's vectors."""

from __future__ import annotations

import pytest
from langchain_core.embeddings import Embeddings

from keeper_middleware import ArgumentTypeError
from keeper_middleware.retrievers import Passage
from keeper_middleware.retrievers.embedders import HashingEmbedder, LangChainEmbedder, as_embedder
from keeper_middleware.retrievers.embedding import EmbeddingRetriever
from keeper_middleware.retrievers.factory import make_retriever

pytest.importorskip("chromadb")


class WordHashEmbeddings(Embeddings):
    """A LangChain embeddings class (word hashing, no model), recording what it was asked."""

    model = "word-hash-64"

    def __init__(self) -> None:
        self.inner = HashingEmbedder(dim=64)
        self.documents: list[str] = []
        self.queries: list[str] = []

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self.documents += texts
        return self.inner(texts)

    def embed_query(self, text: str) -> list[float]:
        self.queries.append(text)
        return self.inner([text])[0]


PASSAGES = [
    Passage(session="s", item=1, position=0, text="The ferry left the harbour at dawn."),
    Passage(session="s", item=2, position=1, text="Mira counted the apples in the cellar."),
]


def test_the_embedding_backend_indexes_and_searches_with_a_langchain_embeddings(tmp_path):
    embeddings = WordHashEmbeddings()
    retriever = EmbeddingRetriever(tmp_path / "index", embedder=embeddings)
    retriever.add(PASSAGES)
    hits = retriever.search("apples cellar", session="s", k=1)
    retriever.close()
    assert hits[0].passage.text == "Mira counted the apples in the cellar."
    assert embeddings.queries == ["apples cellar"]
    assert any("ferry" in text for text in embeddings.documents)
    # the folder remembers the model: another embedder is refused
    with pytest.raises(ValueError, match="langchain:WordHashEmbeddings:word-hash-64"):
        EmbeddingRetriever(tmp_path / "index", embedder=HashingEmbedder(dim=64))


def test_make_retriever_takes_one_too(tmp_path):
    retriever = make_retriever("embedding", path=tmp_path / "idx", embedder=WordHashEmbeddings())
    retriever.add(PASSAGES)
    assert retriever.search("ferry harbour", session="s", k=1)[0].passage.item == 1
    retriever.close()


def test_as_embedder_keeps_a_callable_and_refuses_anything_else():
    plain = HashingEmbedder(dim=16)
    assert as_embedder(plain) is plain
    assert isinstance(as_embedder(WordHashEmbeddings()), LangChainEmbedder)
    with pytest.raises(ArgumentTypeError, match="embedder must be"):
        as_embedder(42)  # type: ignore[arg-type]
