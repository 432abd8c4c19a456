"""Keyword search skips replies that say nothing and the question itself, and keeps the rest."""

import pytest

from keeper_middleware.retrievers.base import Passage
from keeper_middleware.retrievers.keyword import KeywordRetriever
from keeper_middleware.retrievers.noise import is_the_question, says_nothing

QUESTION = "What did Melanie paint last summer?"


def _indexed(texts: list[str], *, speaker: str = "Melanie") -> KeywordRetriever:
    retriever = KeywordRetriever()
    retriever.add(
        [
            Passage(session="s", item=i, position=i, text=text, context=f"{speaker} (May 2023)")
            for i, text in enumerate(texts)
        ]
    )
    return retriever


def test_replies_made_of_stop_words_and_acknowledgements_say_nothing():
    assert says_nothing("Ok, thanks!")
    assert says_nothing("Yeah, that's cool.")
    assert says_nothing("")
    assert not says_nothing("Ok, I painted a sunset.")


def test_the_question_asked_again_is_the_question_but_an_answer_is_not():
    assert is_the_question("what did melanie paint last summer?", QUESTION)
    assert not is_the_question("Melanie paint last summer", QUESTION)  # not a question
    assert not is_the_question("What did Melanie paint?", QUESTION)  # asks less
    assert not is_the_question("Why?", "Why?")  # no content words: left to says_nothing


def test_a_reply_matching_only_the_speakers_name_is_not_returned():
    retriever = _indexed(["Ok", "Thanks!", "I painted a sunset over the lake last summer.", "Yes"])
    hits = retriever.search("What did Melanie paint?", session="s", k=5)
    assert [h.passage.text for h in hits] == ["I painted a sunset over the lake last summer."]


def test_the_asking_message_is_not_its_own_answer():
    retriever = _indexed([QUESTION, "Last summer Melanie painted a lighthouse.", "Nice!"])
    hits = retriever.search(QUESTION, session="s", k=3)
    assert [h.passage.position for h in hits] == [1]


def test_skipped_passages_do_not_shorten_the_list():
    noise = ["Ok"] * 6 + ["Thanks"] * 6
    answers = [f"Melanie painted canvas number {n}." for n in range(4)]
    retriever = _indexed(noise + answers)
    hits = retriever.search("Melanie", session="s", k=4)
    assert sorted(h.passage.position for h in hits) == [12, 13, 14, 15]


def test_skipped_passages_stay_archived_and_counted():
    retriever = _indexed(["Ok", "Thanks!"])
    assert retriever.search("Melanie", session="s", k=5) == []
    assert retriever.count("s") == 2


@pytest.mark.postgres
def test_postgres_keyword_search_skips_them_as_sqlite_does(postgres_url, pg_schema):
    from keeper_middleware.retrievers.postgres_keyword import PostgresKeywordRetriever

    retriever = PostgresKeywordRetriever(postgres_url, schema=pg_schema)
    try:
        noise = ["Ok, thanks!"] * 6 + [QUESTION]
        answers = ["Melanie painted a sunset over the lake last summer.", "Melanie paints often."]
        retriever.add(
            [
                Passage(session="s", item=i, position=i, text=text)
                for i, text in enumerate(noise + answers)
            ]
        )
        hits = retriever.search(QUESTION, session="s", k=2)
        assert sorted(h.passage.position for h in hits) == [7, 8]
        assert retriever.count("s") == 9  # skipped, still indexed
    finally:
        retriever.close()
