"""The SQLite FTS5 keyword backend: ranking against a reference BM25, tokens, queries, storage."""

import sqlite3
import threading

import pytest
from rank_bm25 import BM25Okapi

from keeper_middleware.retrievers import keyword
from keeper_middleware.retrievers.base import Passage
from keeper_middleware.retrievers.keyword import KeywordRetriever, match_expression, query_terms

# Every query term below appears in fewer than half of the documents, where FTS5's IDF and
# rank-bm25's agree in sign; the documents differ enough in term counts that the order is clear.
CORPUS = [
    "the clerk recorded domo86 at nine and the clerk recorded domo86 again",
    "domo86 was lost in the river",
    "mira added four to kalo17 near the mill",
    "kalo17 and domo86 were counted by the miller at the mill",
    "the rain kept on all night over the village",
    "a cart rolled past the gate and the rain kept on",
    "the miller counted the sacks twice before dawn",
    "nobody spoke for a long while in the square",
    "the lamps were lit early that evening",
    "kalo17 kalo17 kalo17 was written on every sack",
    "the courier left the gate open",
    "smoke rose over the granary roof",
]
QUERIES = ["domo86", "kalo17 mill", "rain gate", "miller counted dawn", "domo86 river lost"]


def reference_top(query: str, k: int) -> list[int]:
    bm25 = BM25Okapi([doc.split() for doc in CORPUS], k1=1.2, b=0.75)
    scores = bm25.get_scores(query.split())
    ranked = sorted(range(len(CORPUS)), key=lambda i: -scores[i])
    return [i for i in ranked[:k] if scores[i] > 0]


@pytest.fixture
def retriever():
    r = KeywordRetriever()
    yield r
    r.close()


@pytest.fixture
def indexed(retriever):
    retriever.add([Passage(session="s", item=i, position=i, text=t) for i, t in enumerate(CORPUS)])
    return retriever


@pytest.mark.parametrize("query", QUERIES)
def test_top_results_match_reference_bm25(indexed, query):
    ours = [hit.passage.position for hit in indexed.search(query, session="s", k=3)]
    assert ours == reference_top(query, 3)


def test_query_terms_are_lowercased_deduplicated_words():
    assert query_terms("Domo86, domo86 AND the (clerk)!") == ["domo86", "and", "the", "clerk"]
    assert query_terms("?! ... --") == []


def test_every_term_is_quoted_so_no_word_is_an_fts_operator():
    assert match_expression(["near", "or", 'say"s']) == '"near" OR "or" OR "say""s"'


@pytest.mark.parametrize(
    "query", ['domo86"', "(domo86)", "domo86 NOT", "domo86*", "^domo86", "col:domo86", "-domo86"]
)
def test_fts_syntax_in_free_text_is_read_as_words(indexed, query):
    assert indexed.search(query, session="s", k=1)[0].passage.text == CORPUS[0]


def test_names_with_digits_match_only_exactly(retriever):
    texts = ["domo86 rose.", "domo8 fell.", "domo861 held.", "domo stayed."]
    retriever.add([Passage(session="s", item=1, position=i, text=t) for i, t in enumerate(texts)])
    assert [h.passage.text for h in retriever.search("domo86", session="s")] == ["domo86 rose."]
    assert [h.passage.text for h in retriever.search("domo", session="s")] == ["domo stayed."]


def test_inflected_words_and_accents_still_match(retriever):
    texts = ["The clerk recorded it.", "Zoë sat in the café."]
    retriever.add([Passage(session="s", item=1, position=i, text=t) for i, t in enumerate(texts)])
    assert retriever.search("records", session="s")[0].passage.text == texts[0]
    assert retriever.search("zoe cafe", session="s")[0].passage.text == texts[1]


def test_common_words_are_only_used_when_rare_ones_fall_short(retriever):
    filler = [f"the rain fell on the square for hour {i}." for i in range(60)]
    texts = [*filler, "the clerk noted vela44 twice."]
    retriever.add([Passage(session="s", item=1, position=i, text=t) for i, t in enumerate(texts)])
    hits = retriever.search("the vela44 rain", session="s", k=3)
    assert hits[0].passage.text == "the clerk noted vela44 twice."
    assert len(hits) == 3  # filled up from passages that only share the common words
    assert len({h.passage.position for h in hits}) == 3


def test_shares_a_sqlite_file_with_other_tables_in_wal_mode(tmp_path):
    path = tmp_path / "archive.sqlite3"
    with sqlite3.connect(path) as other:
        other.execute("CREATE TABLE turns (id INTEGER PRIMARY KEY, body TEXT)")
        other.execute("INSERT INTO turns (body) VALUES ('kept')")
    retriever = KeywordRetriever(path)
    retriever.add([Passage(session="s", item=1, position=0, text="domo86 rose.")])
    retriever.close()
    with sqlite3.connect(path) as check:
        tables = {
            row[0] for row in check.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        assert check.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert check.execute("SELECT body FROM turns").fetchall() == [("kept",)]
    assert "turns" in tables
    assert all(name == "turns" or name.startswith("kw_") for name in tables)


def test_adds_and_searches_from_several_threads(retriever):
    errors: list[BaseException] = []

    def write(session: str) -> None:
        try:
            for position in range(50):
                retriever.add(
                    [
                        Passage(
                            session=session,
                            item=position,
                            position=position,
                            text=f"domo86 moved {position}.",
                        )
                    ]
                )
                retriever.search("domo86", session=session, k=3)
        except BaseException as error:  # collected so the main thread can fail the test
            errors.append(error)

    threads = [threading.Thread(target=write, args=(f"s{i}",)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert [retriever.count(f"s{i}") for i in range(3)] == [50, 50, 50]


def test_a_closed_retriever_says_so(retriever):
    retriever.close()
    with pytest.raises(RuntimeError, match="closed"):
        retriever.search("domo86", session="s")


def test_an_old_match_is_found_even_when_newer_matches_fill_the_candidates(retriever, monkeypatch):
    monkeypatch.setattr(keyword, "_CANDIDATES", 5)
    monkeypatch.setattr(keyword, "_RANGE_SCAN", 3)  # item ranges too wide to narrow the ids
    retriever.add([Passage(session="old", item=1, position=0, text="domo86 was sealed.")])
    retriever.add(
        [Passage(session="new", item=i, position=i, text=f"domo86 moved {i}.") for i in range(20)]
    )
    assert [h.passage.text for h in retriever.search("domo86", session="old")] == [
        "domo86 was sealed."
    ]
    hits = retriever.search("domo86", session="new", k=3, from_item=2, to_item=8)
    assert [h.passage.item for h in hits] == [8, 7, 6]  # equal scores: newest first
    assert len(retriever.search("domo86", session="new", k=20)) == 20  # k beyond the candidates


def _automerge(path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("SELECT v FROM kw_fts_config WHERE k = 'automerge'").fetchone()[0])


def test_the_index_merges_sixteen_segments_at_a_time_also_in_a_file_made_before(tmp_path):
    path = tmp_path / "keyword.sqlite3"
    KeywordRetriever(path).close()
    assert _automerge(path) == keyword._AUTOMERGE == 16
    with sqlite3.connect(path) as db:  # a file from before the setting: FTS5's default, 4
        db.execute("INSERT INTO kw_fts (kw_fts, rank) VALUES ('automerge', 4)")
    reopened = KeywordRetriever(path)
    reopened.add([Passage(session="s", item=i, position=i, text=t) for i, t in enumerate(CORPUS)])
    assert _automerge(path) == 16
    best = reopened.search("domo86 river lost", session="s")[0]
    assert best.passage.position == 1
    reopened.close()


def test_a_word_in_most_passages_only_fills_up_the_results_unranked():
    """ "about" is in every passage: its IDF is almost zero, and ranking by it (bm25() reads its
    whole list at every search) would put the newest passages that match nothing else among
    the candidates. Its matches only fill up a short list, newest first, scored 0."""
    index = KeywordRetriever()
    chatter = [Passage("s", n, n, f"We talked about the weather on day {n}.") for n in range(100)]
    zebras = [Passage("s", 200 + n, 100 + n, f"We talked about the zebra {n}.") for n in range(2)]
    index.add(chatter + zebras)
    hits = index.search("What did we say about the zebra crossing?", session="s", k=10)
    assert sorted(h.passage.position for h in hits[:2]) == [100, 101]
    assert all(h.score > 0 for h in hits[:2])
    assert [h.passage.position for h in hits[2:]] == list(range(99, 91, -1))
    assert all(h.score == 0.0 for h in hits[2:])
    alone = index.search("about", session="s", k=10)  # alone, it is ranked by
    assert len(alone) == 10 and all(h.score > 0 for h in alone)
    index.close()
