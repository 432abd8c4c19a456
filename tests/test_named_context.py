"""Names and dates in a question lift the passages of that speaker and that time."""

from keeper_middleware.retrievers.base import Hit, Passage
from keeper_middleware.retrievers.embedders import HashingEmbedder
from keeper_middleware.retrievers.embedding import EmbeddingRetriever
from keeper_middleware.retrievers.keyword import KeywordRetriever
from keeper_middleware.retrievers.named_context import (
    fuse_named,
    may_name,
    named_times,
    speaker_of,
)

TURNS = [
    # (speaker, date, text): Ben repeats the question's words; Ana's turn answers it
    ("Ben", "3 June, 2023", "Did you paint the lake at sunset? I love painting lakes at sunset."),
    ("Ana", "8 July, 2023", "I painted the old lighthouse, it took me all week to finish."),
    ("Ben", "8 July, 2023", "Sunset painting again tomorrow, the lake is calm at sunset."),
    *[("Cleo", "9 July, 2023", f"The bakery on street {n} sells rye bread.") for n in range(5)],
]


def _indexed(*, named_context: bool = True) -> KeywordRetriever:
    retriever = KeywordRetriever(named_context=named_context)
    retriever.add(
        [
            Passage(session="s", item=i, position=i, text=text, context=f"{who} ({date})")
            for i, (who, date, text) in enumerate(TURNS)
        ]
    )
    return retriever


def test_the_context_says_who_and_the_text_says_when():
    assert speaker_of("Caroline (8 May, 2023), item 3") == "Caroline"
    assert speaker_of("") == ""
    assert named_times("on October 13, 2023, or in May") == {"October", "2023", "May"}


def test_only_a_capitalised_word_or_a_date_makes_a_query_go_deeper():
    assert may_name("What did Ana paint?")
    assert may_name("what happened in 2023")
    assert not may_name("What did you paint at sunset?")  # "What" is a stop word


def test_the_named_speakers_answer_rises_above_the_other_speakers_echo():
    query = "What did Ana paint at sunset?"
    plain = _indexed(named_context=False).search(query, session="s", k=3)
    named = _indexed().search(query, session="s", k=3)
    assert plain[0].passage.position != 1
    assert named[0].passage.position == 1
    assert {h.passage.position for h in named} == {h.passage.position for h in plain}


def test_a_named_month_lifts_the_passages_dated_in_it():
    hits = _indexed().search("painting the lake at sunset in July", session="s", k=1)
    assert hits[0].passage.context.endswith("(8 July, 2023)")


def test_a_question_naming_no_one_keeps_the_plain_order():
    candidates = [
        Hit(
            passage=Passage(session="s", item=0, position=p, text="x", context="Ana (May)"), score=1
        )
        for p in (3, 1, 2)
    ]
    assert fuse_named("what about x", candidates, k=2) == candidates[:2]


def test_a_role_is_not_a_name():
    candidates = [
        Hit(passage=Passage(session="s", item=0, position=p, text="x", context=who), score=1)
        for p, who in ((2, "assistant (May)"), (1, "user (May)"))
    ]
    assert fuse_named("what did the User say", candidates, k=2) == candidates


def test_the_embedding_backend_lifts_the_passages_dated_in_the_named_month():
    def nearest(named_dates: bool) -> str:
        retriever = EmbeddingRetriever(embedder=HashingEmbedder(), named_dates=named_dates)
        try:
            retriever.add(
                [
                    Passage(session="s", item=i, position=i, text=text, context=f"Ana ({date})")
                    for i, (_, date, text) in enumerate(TURNS)
                ]
            )
            query = "Did Ana paint the lake at sunset in July?"
            return retriever.search(query, session="s", k=1)[0].passage.context
        finally:
            retriever.close()

    assert "July" not in nearest(named_dates=False)
    assert nearest(named_dates=True).endswith("July, 2023)")


def test_the_first_hits_do_not_depend_on_how_many_are_asked_for():
    retriever = KeywordRetriever()
    retriever.add(
        [
            Passage(
                session="s",
                item=n,
                position=n,
                text=f"The lake painting number {n} at sunset.",
                context=f"{'Ana' if n % 3 == 0 else 'Ben'} ({n % 28 + 1} July, 2023)",
            )
            for n in range(300)
        ]
    )
    query = "Which lake painting did Ana finish?"
    ten = [h.passage.position for h in retriever.search(query, session="s", k=10)]
    scanned = [h.passage.position for h in retriever.search(query, session="s", k=200)]
    assert scanned[:10] == ten
    assert len(scanned) == 200 and len(set(scanned)) == 200
    assert all(position % 3 == 0 for position in ten)  # Ana's paintings come first
