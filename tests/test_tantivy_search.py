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


@pytest.fixture
def scaled(tmp_path):
    """An index where a word in more than 5 passages counts as common (100,000 by default),
    ranked among the newest passages holding about 6 of its matches."""
    made = TantivyKeywordRetriever(tmp_path / "scaled", common_passages=5, newest_matches=6)
    yield made
    made.close()


def _kites(
    retriever: TantivyKeywordRetriever, start: int = 0, count: int = 40, session: str = "s"
) -> None:
    """Every fourth line flies a kite (the first three times); the second has a lantern."""
    lines = {0: "kite kite kite over the hill", 1: "a kite and a lantern by the hill"}
    kite_or_rain = [f"a kite by the hill {n}" if n % 4 == 0 else f"rain {n}" for n in range(80)]
    retriever.add(
        [
            _passage(n, lines.get(n - start, kite_or_rain[n]), session)
            for n in range(start, start + count)
        ]
    )


def test_a_common_word_is_ranked_among_its_newest_matches_only(scaled, retriever):
    _kites(scaled)
    _kites(retriever)

    hits = scaled.search("kite", session="s", k=2)

    assert [h.passage.position for h in retriever.search("kite", session="s", k=1)] == [0]
    assert all(h.passage.position >= 18 for h in hits) and len(hits) == 2  # the 22 newest


def test_a_passage_with_a_rarer_word_is_ranked_by_every_word_wherever_it_is(scaled, retriever):
    _kites(scaled)
    _kites(retriever)

    best = scaled.search("kite lantern", session="s", k=3)
    everywhere = retriever.search("kite lantern", session="s", k=1)

    assert best[0].passage.position == 1 == everywhere[0].passage.position
    assert best[0].score == pytest.approx(everywhere[0].score)
    assert all(h.passage.position >= 18 for h in best[1:])


def test_every_match_is_ranked_when_the_newest_hold_too_few(scaled):
    _kites(scaled)

    assert len(scaled.search("kite", session="s", k=20)) == 11
    within = scaled.search("kite", session="s", k=3, within=Spans.of([(0, 10)]))
    assert [h.passage.position for h in within] == [0, 8, 4]


def test_the_newest_passages_move_with_what_is_added(scaled):
    _kites(scaled)
    assert scaled.search("kite", session="s", k=1)[0].passage.position >= 18

    _kites(scaled, start=40, count=4)  # a line with the kite three times, among the newest

    assert [h.passage.position for h in scaled.search("kite", session="s", k=1)] == [40]


def test_the_newest_passages_are_the_sessions_own_in_a_shared_index(scaled):
    _kites(scaled, session="a")
    _kites(scaled, session="b")
    _kites(scaled, start=40, count=4, session="a")  # "a" goes on; "b" does not

    newest_a = scaled.search("kite", session="a", k=1)
    newest_b = scaled.search("kite", session="b", k=2)

    assert [(h.passage.session, h.passage.position) for h in newest_a] == [("a", 40)]
    assert {h.passage.session for h in newest_b} == {"b"}
    assert all(18 <= h.passage.position < 40 for h in newest_b)
