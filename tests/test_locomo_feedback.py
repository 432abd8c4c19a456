"""Pseudo-relevance feedback for the keyword backend, the benchmark's ``prf`` option."""

import pytest

from keeper_bench.locomo.feedback import FeedbackKeywordRetriever, expansion_terms
from keeper_bench.locomo.recall import MethodSpec, build_retriever
from keeper_middleware.retrievers.base import Passage
from keeper_middleware.retrievers.keyword import KeywordRetriever

FREQUENCY = {"adoption": 2, "agencies": 2, "caroline": 40, "research": 3, "weekend": 9, "ok": 1}


def test_the_words_frequent_in_the_feedback_and_rare_in_the_index_are_chosen():
    feedback = [
        "I looked into adoption agencies this weekend.",
        "The adoption forms from two agencies came, ok.",
    ]
    chosen = expansion_terms(
        feedback,
        query="What did Caroline research?",
        document_frequency=FREQUENCY,
        documents=100,
        terms=3,
    )
    assert chosen == ["adoption", "agencies", "weekend"]


def test_the_query_words_stop_words_short_tokens_and_common_words_are_never_added():
    chosen = expansion_terms(
        ["Caroline said ok: the research was what she did, Caroline again."],
        query="What did Caroline research?",
        document_frequency={**FREQUENCY, "said": 60, "again": 5},
        documents=100,
        terms=10,
    )
    assert chosen == ["again"]


def test_no_feedback_adds_nothing():
    assert expansion_terms([], query="anything", document_frequency={}, documents=0, terms=5) == []


def passages(texts: list[str]) -> list[Passage]:
    return [
        Passage(session="s", item=index, position=index, text=text)
        for index, text in enumerate(texts)
    ]


TEXTS = [
    "Caroline did her research on adoption agencies.",
    "Adoption agencies sent her the application forms.",
    *[f"We talked about the weather on day {n} and the garden." for n in range(30)],
]


def test_feedback_finds_a_passage_that_shares_no_word_with_the_question():
    plain = KeywordRetriever()
    plain.add(passages(TEXTS))
    expanded = FeedbackKeywordRetriever(KeywordRetriever(), feedback_docs=1, feedback_terms=2)
    expanded.add(passages(TEXTS))
    try:
        question = "What did Caroline research?"
        assert [h.passage.position for h in plain.search(question, session="s", k=5)] == [0]
        assert expanded.expansion(question, session="s") == ["adoption", "agencies"]
        found = [h.passage.position for h in expanded.search(question, session="s", k=5)]
        assert found[:2] == [0, 1]
        assert expanded.search(question, session="s", k=5, to_item=0)[0].passage.position == 0
        assert len(expanded.search(question, session="s", k=5, to_item=0)) == 1
    finally:
        plain.close()
        expanded.close()


@pytest.mark.parametrize(
    ("text", "feedback", "fused"),
    [
        ("keyword:prf", (5, 5), True),
        ("keyword:prf=10/8", (10, 8), True),
        ("hybrid:hashing:prfonly=3/4", (3, 4), False),
        ("keyword", None, True),
    ],
)
def test_feedback_options_parse(text, feedback, fused):
    spec = MethodSpec.parse(text)
    assert (spec.feedback, spec.feedback_fused) == (feedback, fused)


@pytest.mark.parametrize("text", ["keyword:prf=5", "keyword:prf=0/5", "keyword:prf=a/b"])
def test_a_malformed_feedback_option_says_how_to_write_it(text):
    with pytest.raises(ValueError, match="prf=DOCS/TERMS"):
        MethodSpec.parse(text)


def test_the_hybrid_expands_its_keyword_side():
    retriever = build_retriever(MethodSpec.parse("hybrid:hashing:prf"), {})
    try:
        assert "FeedbackKeywordRetriever" in repr(retriever)
    finally:
        retriever.close()
