"""The tantivy engine's search at scale: a word in most passages is not ranked by (its list is
the longest a search reads, and its IDF the smallest), and the search tool's count comes from
the index's document frequencies when they say there are enough matches."""

from __future__ import annotations

import pytest

from keeper_middleware.retrievers.base import Passage, Spans
from keeper_middleware.retrievers.tantivy_keyword import TantivyKeywordRetriever

pytest.importorskip("tantivy")


def _passage(position: int, text: str, session: str = "s") -> Passage:
    return Passage(session=session, item=position, position=position, text=text)


@pytest.fixture
def retriever(tmp_path):
    made = TantivyKeywordRetriever(tmp_path / "tantivy")
    yield made
    made.close()


def _chat(retriever: TantivyKeywordRetriever) -> None:
    """Twelve lines that all say "talked about"; the two oldest name the picnic."""
    retriever.add(
        [_passage(n, f"we talked about the {'picnic' if n < 2 else 'weather'}") for n in range(12)]
    )


def test_a_word_in_most_passages_only_fills_up_the_results_newest_first(retriever):
    _chat(retriever)

    hits = retriever.search("talked about the picnic", session="s", k=5)

    assert [h.passage.position for h in hits] == [1, 0, 11, 10, 9]
    assert all(h.score > 0 for h in hits[:2])
    assert [h.score for h in hits[2:]] == [0.0, 0.0, 0.0]


def test_the_filling_stays_within_the_branchs_spans(retriever):
    _chat(retriever)

    hits = retriever.search(
        "talked about the picnic", session="s", k=5, within=Spans.of([(0, 1), (5, 8)])
    )

    assert [h.passage.position for h in hits] == [0, 7, 6, 5]


def test_a_question_made_only_of_common_words_is_ranked_by_them(retriever):
    _chat(retriever)

    hits = retriever.search("talked about", session="s", k=3)

    assert len(hits) == 3
    assert all(h.score > 0 for h in hits)


def test_the_count_read_from_the_index_never_counts_replaced_passages(retriever):
    retriever.add([_passage(n, f"the lantern number {n}") for n in range(30)])
    assert retriever.search_counted("lantern", session="s", k=2, limit=20)[1] == 20

    retriever.add([_passage(n, f"the candle number {n}") for n in range(20)])  # replaced

    hits, count = retriever.search_counted("lantern", session="s", k=2, limit=20)
    assert count == 10 == len(retriever.search("lantern", session="s", k=20))
    assert {h.passage.position for h in hits} <= set(range(20, 30))


def test_the_count_in_a_shared_index_is_the_sessions_own(retriever):
    retriever.add([_passage(n, f"the lantern number {n}", session="a") for n in range(30)])
    retriever.add([_passage(n, f"the lantern number {n}", session="b") for n in range(5)])

    assert retriever.search_counted("lantern", session="b", k=2, limit=20)[1] == 5
    assert retriever.search_counted("lantern", session="a", k=2, limit=20)[1] == 20


def test_the_tools_search_shows_what_a_search_for_that_few_returns(retriever):
    retriever.add([_passage(n, f"lantern {'lantern ' * (n % 3)}and a wick {n}") for n in range(60)])

    shown, count = retriever.search_counted("lantern wick", session="s", k=10, limit=50)

    assert count == 50
    searched = retriever.search("lantern wick", session="s", k=10)
    assert [h.passage.position for h in shown] == [h.passage.position for h in searched]
