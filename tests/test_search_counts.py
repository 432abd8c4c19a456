"""The search tool shows a few hits and says how many match: the hits are ranked as a search for
that few would rank them, and the count costs no deep fused search."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from keeper_middleware import Keeper, KeeperConfig
from keeper_middleware.archive.records import ArchivedTurn
from keeper_middleware.retrievers.base import (
    CountingRetriever,
    Hit,
    Passage,
    Retriever,
    Spans,
    search_and_count,
)
from keeper_middleware.retrievers.embedders import HashingEmbedder
from keeper_middleware.retrievers.embedding import EmbeddingRetriever
from keeper_middleware.retrievers.hybrid import HybridRetriever
from keeper_middleware.retrievers.keyword import KeywordRetriever
from keeper_middleware.retrievers.sentences import passages_from_text
from keeper_middleware.retrievers.tantivy_keyword import TantivyKeywordRetriever

STORY = (
    "The clerk recorded domo86 at three hundred and forty-two. Ten were taken from it. "
    "The rain kept on. Mira added four to kalo17. The miller counted the sacks twice. "
    "A cart rolled past the gate."
)


class RankedList:
    """A backend that answers every query with the same ranked positions (the fake a fusion
    test needs: what each side ranks is the input, not something to reproduce with words), and
    records how many hits it was asked for."""

    def __init__(self, positions: Sequence[int]) -> None:
        self.positions = list(positions)
        self.asked: list[int] = []

    def add(self, passages: Sequence[Passage]) -> None:
        pass

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
        self.asked.append(k)
        return [
            Hit(passage=Passage(session=session, item=p, position=p, text=f"p{p}"), score=1.0)
            for p in self.positions[:k]
            if within is None or p in within
        ]

    def count(self, session: str) -> int:
        return len(self.positions)

    def delete_session(self, session: str) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def positions(hits: Sequence[Hit]) -> list[int]:
    return [hit.passage.position for hit in hits]


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(KeywordRetriever, id="keyword"),
        pytest.param(TantivyKeywordRetriever, id="keyword-tantivy"),
        pytest.param(lambda: EmbeddingRetriever(embedder=HashingEmbedder()), id="embedding"),
        pytest.param(
            lambda: HybridRetriever(
                KeywordRetriever(), EmbeddingRetriever(embedder=HashingEmbedder())
            ),
            id="hybrid",
        ),
    ],
)
def test_every_backend_shows_k_hits_and_counts_the_matches_up_to_the_limit(make):
    retriever = make()
    try:
        retriever.add(passages_from_text("s", 1, STORY, 0))
        hits, total = search_and_count(retriever, "domo86 kalo17", session="s", k=1, limit=50)
        assert len(hits) == 1
        assert 2 <= total <= 6  # both named sentences match; never more than the story holds
        hits, total = search_and_count(retriever, "domo86 kalo17", session="s", k=1, limit=1)
        assert len(hits) == 1 and total == 1
        assert search_and_count(retriever, "domo86", session="s", k=1, limit=5, within=Spans()) == (
            [],
            0,
        )
    finally:
        retriever.close()


@pytest.mark.parametrize(
    "make", [KeywordRetriever, TantivyKeywordRetriever], ids=["fts5", "tantivy"]
)
def test_a_keyword_search_counts_exactly_the_passages_that_share_a_word(make):
    retriever = make()
    retriever.add(passages_from_text("s", 1, STORY, 0))
    hits, total = search_and_count(retriever, "domo86 kalo17", session="s", k=1, limit=50)
    assert total == 2
    assert positions(hits) == positions(retriever.search("domo86 kalo17", session="s", k=1))


def test_the_hybrid_shows_what_a_search_for_that_few_hits_fuses():
    """Fused from 400-deep lists, a passage both sides rank middling (7) would outrank the one
    the embedding side ranks first (20): the tool's hits are the ones ``search(k)`` returns (a tie
    goes to the newer passage)."""
    keyword = RankedList([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
    embedding = RankedList([20, 21, 22, 23, 24, 25, 7])
    hybrid = HybridRetriever(keyword, embedding)
    assert isinstance(hybrid, CountingRetriever)
    hits, total = search_and_count(hybrid, "q", session="s", k=2, limit=200)
    assert positions(hits) == positions(hybrid.search("q", session="s", k=2)) == [20, 1]
    # every passage that shares a word, and the nearest by meaning that were fused
    assert total == len({*keyword.positions, 20, 21})
    # only the keyword side counts up to the limit; the embedding side is asked for what is fused
    assert keyword.asked[0] == 200 and embedding.asked[0] == 2


def test_the_hybrid_count_stops_at_the_limit():
    hybrid = HybridRetriever(RankedList(range(500)), RankedList(range(1000, 1500)))
    hits, total = search_and_count(hybrid, "q", session="s", k=10, limit=200)
    assert len(hits) == 10 and total == 200


class CountingList(RankedList):
    """A :class:`RankedList` that counts its matches itself, as tantivy's index does."""

    def __init__(self, positions: Sequence[int]) -> None:
        super().__init__(positions)
        self.counted: list[tuple[int, int]] = []

    def search_counted(
        self, query: str, *, session: str, k: int, limit: int, **span: Any
    ) -> tuple[list[Hit], int]:
        self.counted.append((k, limit))
        hits = self.search(query, session=session, k=k, within=span.get("within"))
        return hits, min(len(self.positions), limit)


def test_a_keyword_side_that_counts_is_never_asked_for_the_limit_when_that_many_match():
    keyword = CountingList(range(500))
    hybrid = HybridRetriever(keyword, RankedList([1000, 3, 1001]))
    hits, total = search_and_count(hybrid, "q", session="s", k=10, limit=200)
    assert total == 200
    assert positions(hits) == positions(hybrid.search("q", session="s", k=10))
    assert keyword.counted == [(10, 200)] and 200 not in keyword.asked


def test_a_keyword_side_that_counts_fewer_than_the_limit_is_counted_with_the_embeddings():
    keyword = CountingList([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
    embedding = RankedList([20, 21, 22, 23, 24, 25, 7])
    hybrid = HybridRetriever(keyword, embedding)
    hits, total = search_and_count(hybrid, "q", session="s", k=2, limit=200)
    assert positions(hits) == positions(hybrid.search("q", session="s", k=2)) == [20, 1]
    assert total == len({*keyword.positions, 20, 21})


def test_the_tantivy_hybrid_shows_what_its_search_fuses_and_counts_to_the_limit():
    hybrid = HybridRetriever(
        TantivyKeywordRetriever(), EmbeddingRetriever(embedder=HashingEmbedder())
    )
    try:
        texts = [f"domo86 changed in round {n} of the {n % 3}th game." for n in range(30)]
        hybrid.add([Passage(session="s", item=n, position=n, text=t) for n, t in enumerate(texts)])
        for question in ("domo86 round", "what changed in the game?"):
            hits, total = search_and_count(hybrid, question, session="s", k=3, limit=10)
            assert total == 10
            assert positions(hits) == positions(hybrid.search(question, session="s", k=3))
    finally:
        hybrid.close()


def test_a_backend_that_cannot_count_is_searched_for_the_limit():
    backend = RankedList(range(30))
    assert not isinstance(backend, CountingRetriever)
    hits, total = search_and_count(backend, "q", session="s", k=3, limit=20)
    assert positions(hits) == [0, 1, 2] and total == 20 and backend.asked == [20]


def test_a_limit_below_k_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="limit must be an int of at least k=5"):
        search_and_count(RankedList([1]), "q", session="s", k=5, limit=3)


def archive(keeper: Keeper, session: str, texts: list[str]) -> None:
    turns = [
        ArchivedTurn(session=session, msg_id=f"m{n}", item=n + 1, role="human", content=text)
        for n, text in enumerate(texts)
    ]
    keeper.archive.commit_cut(session, cut_key="seed", turns=turns, notes=None)
    keeper._sync_index(session)


def test_the_search_tool_with_the_hybrid_shows_the_fused_hits_and_the_count():
    hybrid = HybridRetriever(KeywordRetriever(), EmbeddingRetriever(embedder=HashingEmbedder()))
    keeper = Keeper(KeeperConfig(search_results=3), retriever=hybrid)
    try:
        texts = [f"domo86 changed in round {n}." for n in range(7)]
        texts += [f"The rain went on for the {n}th day." for n in range(20)]
        archive(keeper, "s", texts)
        result = keeper.search("s", "domo86 round")
        first, *shown = result.splitlines()
        fused = hybrid.search("domo86 round", session="s", k=3)
        assert len(shown) == 3
        assert sorted(f"item {h.passage.item}" for h in fused) == sorted(
            line.split(":")[0] for line in shown
        )
        # seven passages share a word; the embedding side's nearest may add a few more
        total = int(first.split(" of ")[1].split()[0])
        assert first.startswith("Showing 3 of ") and 7 <= total <= 7 + 3
        assert "cut short" in first
    finally:
        keeper.close()


def test_a_counting_retriever_is_a_retriever_too():
    hybrid: Retriever = HybridRetriever(RankedList([1]), RankedList([2]))
    assert isinstance(hybrid, Retriever) and isinstance(hybrid, CountingRetriever)
