"""What a passage's vector embeds: its context said once, and the fusion of the hybrid's lists."""

import pytest

from keeper_middleware.retrievers.base import Hit, Passage
from keeper_middleware.retrievers.embedders import HashingEmbedder
from keeper_middleware.retrievers.embedding import EmbeddingRetriever
from keeper_middleware.retrievers.hybrid import (
    HybridRetriever,
    reciprocal_rank_fusion,
    score_fusion,
)
from keeper_middleware.retrievers.keyword import KeywordRetriever
from keeper_middleware.retrievers.vector_text import short_context, vector_text, without_header

CONTEXT = "Caroline (1:56 pm on 8 May, 2023), item 3"
TURN = "Caroline (1:56 pm on 8 May, 2023): I went to a support group yesterday."


def test_the_whole_form_is_the_indexed_text():
    assert vector_text(CONTEXT, TURN, "whole") == f"{CONTEXT}: {TURN}"
    assert vector_text("", "Just words.", "whole") == "Just words."


def test_the_header_a_turn_repeats_from_its_context_is_said_once():
    assert vector_text(CONTEXT, TURN, "once") == f"{CONTEXT}: I went to a support group yesterday."
    # a sentence after the first carries no header: nothing to leave out
    assert vector_text(CONTEXT, "It was powerful.", "once") == f"{CONTEXT}: It was powerful."


def test_the_short_form_drops_the_time_of_day_and_the_item():
    assert short_context(CONTEXT) == "Caroline (8 May, 2023)"
    assert short_context("user, item 12") == "user"
    assert vector_text(CONTEXT, TURN, "short") == (
        "Caroline (8 May, 2023): I went to a support group yesterday."
    )


def test_words_that_do_not_open_with_the_context_are_kept_whole():
    other = "Melanie (1:56 pm on 8 May, 2023): Hey!"
    assert without_header(other, CONTEXT) == other
    # a header with nothing after it is kept: a vector of nothing finds nothing
    bare = "Caroline (1:56 pm on 8 May, 2023):"
    assert without_header(bare, CONTEXT) == bare


def test_the_embedding_retriever_embeds_the_form_it_is_given():
    seen: list[str] = []

    def recording(texts: list[str]) -> list[list[float]]:
        seen.extend(texts)
        return HashingEmbedder()(texts)

    retriever = EmbeddingRetriever(embedder=recording, vector_text="short")
    try:
        retriever.add(
            [Passage(session="s", item=3, position=0, text=f"{TURN} It helped.", context=CONTEXT)]
        )
        retriever.flush()
        assert "Caroline (8 May, 2023): I went to a support group yesterday. It helped." in seen
        assert "Caroline (8 May, 2023): It helped." in seen
        assert not any("item 3" in text or "1:56" in text for text in seen)
        hit = retriever.search("support group", session="s", k=1)[0]
        assert hit.passage.text == f"{TURN} It helped." and hit.passage.context == CONTEXT
    finally:
        retriever.close()


def test_an_unknown_vector_form_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="whole, once, short"):
        EmbeddingRetriever(embedder=HashingEmbedder(), vector_text="bare")


def hits(scores: dict[int, float]) -> list[Hit]:
    return [
        Hit(passage=Passage(session="s", item=0, position=p, text=str(p)), score=s)
        for p, s in scores.items()
    ]


def test_score_fusion_keeps_how_far_ahead_a_first_hit_is():
    """By rank, a passage both lists hold low outranks each list's clear first; by scaled score
    it does not (a tie goes to the newer passage)."""
    keyword = hits({1: 30.0, 3: 2.0, 4: 1.0})
    embedding = hits({2: 0.9, 5: 0.88, 3: 0.3})
    assert reciprocal_rank_fusion([keyword, embedding], k=1)[0].passage.position == 3
    fused = score_fusion([keyword, embedding], k=3)
    assert [h.passage.position for h in fused] == [2, 1, 5]
    assert [round(h.score, 3) for h in fused] == [1.0, 1.0, 0.967]
    heavier = score_fusion([keyword, embedding], k=1, weights=(2.0, 1.0))
    assert heavier[0].passage.position == 1
    assert score_fusion([[], hits({7: 0.5})], k=1)[0].score == 1.0


def test_the_hybrid_takes_a_fusion_by_name():
    with pytest.raises(ValueError, match="rrf, score"):
        HybridRetriever(KeywordRetriever(), KeywordRetriever(), fusion="sum")


def embedded_texts(retriever: EmbeddingRetriever) -> list[str]:
    seen: list[str] = []
    inner = retriever._embedder

    def recording(texts: list[str]) -> list[list[float]]:
        seen.extend(texts)
        return inner(texts)

    retriever._embedder = recording
    retriever.add([Passage(session="s", item=3, position=0, text=TURN, context=CONTEXT)])
    retriever.flush()
    return seen


def test_a_new_index_says_the_header_once_by_default():
    retriever = EmbeddingRetriever(embedder=HashingEmbedder())
    try:
        assert embedded_texts(retriever) == [f"{CONTEXT}: I went to a support group yesterday."]
    finally:
        retriever.close()


def test_a_folder_keeps_the_form_it_was_made_with(tmp_path, caplog):
    EmbeddingRetriever(tmp_path, embedder=HashingEmbedder(), vector_text="whole").close()
    for asked in (None, "once"):
        reopened = EmbeddingRetriever(tmp_path, embedder=HashingEmbedder(), vector_text=asked)
        try:
            assert embedded_texts(reopened)[-1] == f"{CONTEXT}: {TURN}"
        finally:
            reopened.close()
    assert "embeds the 'whole' form of its passages; it keeps it" in caplog.text


def test_a_folder_made_before_the_form_was_recorded_stays_whole(tmp_path):
    import chromadb
    import chromadb.config

    settings = chromadb.config.Settings(anonymized_telemetry=False)
    client = chromadb.PersistentClient(path=str(tmp_path), settings=settings)
    from keeper_middleware.retrievers.embedders import keeper_embedding_function

    client.get_or_create_collection(
        "keeper-passages",
        embedding_function=keeper_embedding_function(HashingEmbedder()),
        configuration={"hnsw": {"space": "cosine"}},
        metadata={"embedder": HashingEmbedder().name},
    )
    retriever = EmbeddingRetriever(tmp_path, embedder=HashingEmbedder())
    try:
        assert embedded_texts(retriever) == [f"{CONTEXT}: {TURN}"]
    finally:
        retriever.close()
