"""Message passages: whole messages cut into bounded chunks, carrying their context, and hits that
show the matched sentence marked with the next one kept."""

import random
import sqlite3

import pytest

from keeper_middleware.messages.facts import text_of
from keeper_middleware.retrievers.base import Hit, Passage
from keeper_middleware.retrievers.embedders import HashingEmbedder
from keeper_middleware.retrievers.embedding import EmbeddingRetriever
from keeper_middleware.retrievers.hybrid import HybridRetriever, reciprocal_rank_fusion
from keeper_middleware.retrievers.keyword import KeywordRetriever
from keeper_middleware.retrievers.passages import (
    MARK_CLOSE,
    MARK_OPEN,
    best_sentence,
    excerpt,
    passages_from_message,
)
from keeper_middleware.retrievers.sentences import split_sentences

WORDS = [
    "river",
    "lamp",
    "harbour",
    "quiet",
    "seven",
    "ledger",
    "copper",
    "window",
    "garden",
    "violin",
]


def message(rng: random.Random, sentences: int) -> str:
    return " ".join(
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30))).capitalize() + "."
        for _ in range(sentences)
    )


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("limit", [80, 300, 1000])
def test_a_message_is_cut_between_sentences_and_loses_no_word(seed, limit):
    rng = random.Random(seed)
    text = message(rng, rng.randint(1, 40))
    passages = passages_from_message("s", 3, text, 10, context="Ana (1 May)", max_chars=limit)
    assert [p.position for p in passages] == list(range(10, 10 + len(passages)))
    assert all(len(p.text) <= limit and p.item == 3 for p in passages)
    assert all(p.context == "Ana (1 May)" for p in passages)
    assert " ".join(p.text for p in passages).split() == text.split()
    if all(len(s) <= limit for s in split_sentences(text)):
        chunked = [s for p in passages for s in split_sentences(p.text)]
        assert chunked == split_sentences(text)  # no sentence is split


def test_a_word_longer_than_a_chunk_is_cut_too():
    passages = passages_from_message("s", 1, "x" * 250, 0, max_chars=100)
    assert [len(p.text) for p in passages] == [100, 100, 50]


def test_the_context_is_searched_but_not_shown():
    retriever = KeywordRetriever()
    retriever.add(
        [
            Passage(
                session="s", item=1, position=0, text="I painted a lake.", context="Ana (8 May)"
            ),
            Passage(session="s", item=1, position=1, text="I ran a race.", context="Ben (8 May)"),
        ]
    )
    hits = retriever.search("What did Ana paint?", session="s", k=1)
    assert hits[0].passage.text == "I painted a lake."
    assert hits[0].passage.context == "Ana (8 May)"
    assert [h.passage.text for h in retriever.search("Ben", session="s")] == ["I ran a race."]


def test_the_embedding_index_embeds_the_context_with_the_text():
    retriever = EmbeddingRetriever(embedder=HashingEmbedder())
    try:
        retriever.add(
            [
                Passage(session="s", item=1, position=0, text="Lovely day.", context="Ana (8 May)"),
                Passage(
                    session="s", item=1, position=1, text="Lovely day.", context="Ben (9 June)"
                ),
            ]
        )
        top = retriever.search("Ben June", session="s", k=1)[0]
        assert (top.passage.position, top.passage.context) == (1, "Ben (9 June)")
    finally:
        retriever.close()


def test_the_sentence_sharing_most_words_with_the_query_is_marked():
    text = "Wow, that's great! I adopted a greyhound called Pepper. She loves the beach."
    assert best_sentence(text, "What is the greyhound called?") == 1
    assert best_sentence(text, "something else entirely") == 0
    hit = Hit(passage=Passage(session="s", item=1, position=0, text=text), score=1.0, sentence=1)
    shown = excerpt(hit)
    assert (
        f"{MARK_OPEN}I adopted a greyhound called Pepper.{MARK_CLOSE} She loves the beach." in shown
    )


def test_a_long_message_shows_a_bounded_excerpt_around_the_match():
    sentences = [f"Sentence number {i} talks about topic {i}." for i in range(60)]
    text = " ".join(sentences)
    hit = Hit(passage=Passage(session="s", item=1, position=0, text=text), score=1.0, sentence=30)
    shown = excerpt(hit, limit=200)
    assert len(shown) <= 400
    assert f"{MARK_OPEN}{sentences[30]}{MARK_CLOSE} {sentences[31]}" in shown
    assert shown.startswith("… ") and shown.endswith(" …")


def test_the_next_passage_is_kept_when_the_match_ends_its_message():
    hit = Hit(
        passage=Passage(session="s", item=1, position=0, text="Hello there. I lost the key."),
        score=1.0,
        next_text="It was under the mat. Anyway.",
        sentence=1,
    )
    assert excerpt(hit).endswith(
        f"{MARK_OPEN}I lost the key.{MARK_CLOSE} → next: It was under the mat."
    )


def test_a_sentence_passage_shows_as_before():
    hit = Hit(
        passage=Passage(session="s", item=4, position=0, text="Next on the list was nipewe33."),
        score=1.0,
        next_text="Mira Holt took ten from it.",
    )
    assert excerpt(hit) == "Next on the list was nipewe33. → next: Mira Holt took ten from it."


def test_backends_mark_the_matching_sentence_of_a_message():
    text = "Hi! Long week. I finally learned the cello. Anyway, see you."
    for retriever in (
        KeywordRetriever(),
        HybridRetriever(KeywordRetriever(), EmbeddingRetriever(embedder=HashingEmbedder())),
    ):
        try:
            retriever.add(passages_from_message("s", 1, text, 0, context="Ben (1 May)"))
            hit = retriever.search("Which instrument did Ben learn, the cello?", session="s", k=1)[
                0
            ]
            assert hit.sentence == 2
        finally:
            retriever.close()


def test_fusion_weights_favour_the_heavier_list():
    def hits(*positions):
        return [
            Hit(passage=Passage(session="s", item=0, position=p, text=str(p)), score=1.0)
            for p in positions
        ]

    keyword, embedding = hits(1, 2), hits(2, 1)
    assert [
        h.passage.position
        for h in reciprocal_rank_fusion([keyword, embedding], k=2, weights=(2.0, 1.0))
    ] == [1, 2]
    assert [
        h.passage.position
        for h in reciprocal_rank_fusion([keyword, embedding], k=2, weights=(1.0, 2.0))
    ] == [2, 1]
    with pytest.raises(ValueError, match="weights"):
        reciprocal_rank_fusion([keyword], k=2, weights=(1.0, 2.0))
    with pytest.raises(ValueError, match="keyword_weight"):
        HybridRetriever(KeywordRetriever(), KeywordRetriever(), keyword_weight=0)


def test_a_keyword_file_from_before_contexts_is_upgraded_and_keeps_its_passages(tmp_path):
    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE kw_passages (id INTEGER PRIMARY KEY, session TEXT NOT NULL, item INTEGER NOT NULL,
            position INTEGER NOT NULL, text TEXT NOT NULL, UNIQUE (session, position));
        CREATE VIRTUAL TABLE kw_fts USING fts5(text, content='kw_passages', content_rowid='id',
            tokenize='porter unicode61 remove_diacritics 2');
        CREATE TRIGGER kw_passages_ai AFTER INSERT ON kw_passages BEGIN
            INSERT INTO kw_fts (rowid, text) VALUES (new.id, new.text); END;
        INSERT INTO kw_passages (session, item, position, text) VALUES ('s', 1, 0, 'The clerk recorded domo86.');
        """
    )
    db.commit()
    db.close()
    retriever = KeywordRetriever(path)
    try:
        assert [h.passage.text for h in retriever.search("domo86", session="s")] == [
            "The clerk recorded domo86."
        ]
        retriever.add(
            [Passage(session="s", item=2, position=1, text="Then it rained.", context="Ana")]
        )
        assert retriever.count("s") == 2
        assert [h.passage.position for h in retriever.search("Ana", session="s")] == [1]
    finally:
        retriever.close()


def test_a_file_is_reopened_only_with_the_stemming_it_was_made_with(tmp_path):
    KeywordRetriever(tmp_path / "kw.sqlite3", stemming=False).close()
    with pytest.raises(ValueError, match="stemming"):
        KeywordRetriever(tmp_path / "kw.sqlite3")


def test_each_line_of_a_transcript_is_its_own_passage():
    text = 'Item 2. Session 2 (8 May):\nAna: "I adopted a greyhound."\nBen: "Lovely! What is her name?"'
    passages = passages_from_message("s", 2, text, 0)
    assert [p.text for p in passages] == [
        "Item 2. Session 2 (8 May):",
        'Ana: "I adopted a greyhound."',
        'Ben: "Lovely! What is her name?"',
    ]


@pytest.mark.parametrize("arm", ["rag", "notes_retrieval"])
def test_an_arm_indexing_messages_shows_the_matched_sentence_next_to_a_question(arm):
    from langchain_core.messages import HumanMessage

    from keeper_bench.arms import build_arm
    from tests.fake_model import ScriptedChatModel

    model = ScriptedChatModel(default="Noted.")
    built = build_arm(arm, model, window=4096, retrieved_per_question=2, passages="messages")
    config = {"configurable": {"thread_id": "t"}}
    try:
        built.graph.invoke(
            {"messages": [HumanMessage("Task: read the items and answer questions.", id="task")]},
            config,
        )
        story = "Hello again. I adopted a greyhound called Pepper. She sleeps a lot."
        built.graph.invoke({"messages": [HumanMessage(f"Item 1. {story}", id="i1")]}, config)
        if arm == "notes_retrieval":  # the keeper indexes what it archives: force a cut
            for n in range(2, 40):
                text = f"Item {n}. " + "The river ran quiet past the mill that day. " * 6
                built.graph.invoke({"messages": [HumanMessage(text, id=f"i{n}")]}, config)
        built.graph.invoke(
            {"messages": [HumanMessage("Questions:\n1. What is the greyhound called?", id="q")]},
            config,
        )
    finally:
        built.close()
    sent = "\n".join(text_of(m) for r in model.received for m in r.messages)
    assert f"{MARK_OPEN}I adopted a greyhound called Pepper.{MARK_CLOSE} She sleeps a lot." in sent


def test_an_unknown_passage_unit_is_refused_with_the_choices():
    from keeper_bench.arms import build_arm
    from keeper_middleware import ConfigurationError, KeeperConfig
    from tests.fake_model import ScriptedChatModel

    with pytest.raises(ConfigurationError, match="sentences, messages"):
        KeeperConfig(window=32_768, passages="paragraphs")
    with pytest.raises(ValueError, match="sentences, messages"):
        build_arm("rag", ScriptedChatModel(default="ok"), window=4096, passages="paragraphs")


def test_a_session_whose_passages_are_all_far_from_the_query_still_gets_its_own():
    """The unfiltered first look finds only another session's passages; the filtered search
    must still answer with this session's."""
    retriever = EmbeddingRetriever(embedder=HashingEmbedder())
    try:
        crowd = [
            Passage(session="a", item=1, position=i, text=f"apple orchard harvest {i}")
            for i in range(60)
        ]
        own = [
            Passage(session="b", item=1, position=0, text="zebra stripes"),
            Passage(session="b", item=2, position=1, text="zebra crossing"),
        ]
        retriever.add(crowd + own)
        hits = retriever.search("apple orchard harvest", session="b", k=2)
        assert sorted(h.passage.text for h in hits) == ["zebra crossing", "zebra stripes"]
        ranged = retriever.search("apple orchard harvest", session="b", k=5, to_item=1)
        assert [h.passage.text for h in ranged] == ["zebra stripes"]
        nearest = retriever.search("apple orchard harvest", session="a", k=3)
        assert all(h.passage.session == "a" for h in nearest) and len(nearest) == 3
    finally:
        retriever.close()
