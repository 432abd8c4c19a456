"""The hybrid's reply window: the turn after a matched one rises (``retrievers/reply_window.py``,
the benchmark's ``replies`` / ``noreplies`` options)."""

import json

import pytest

from keeper_bench.locomo.dataset import load_locomo
from keeper_bench.locomo.methods import MethodSpec, configuration
from keeper_bench.locomo.recall import measure
from keeper_bench.locomo.replies import parse_replies
from keeper_middleware.errors import ConfigurationError
from keeper_middleware.retrievers.base import Hit, Passage
from keeper_middleware.retrievers.embedders import HashingEmbedder
from keeper_middleware.retrievers.embedding import EmbeddingRetriever
from keeper_middleware.retrievers.hybrid import HybridRetriever
from keeper_middleware.retrievers.keyword import KeywordRetriever
from keeper_middleware.retrievers.postgres_keyword import PostgresKeywordRetriever
from keeper_middleware.retrievers.reply_window import PassageLookup, ReplyWindow, reply_ranking


def passage(position: int, item: int = 1, text: str = "") -> Passage:
    return Passage(session="s", item=item, position=position, text=text or f"turn {position}")


def test_the_reply_to_the_best_hit_rises_above_a_lone_weaker_hit_but_not_above_the_kept():
    stored = [passage(p) for p in range(1, 12)]
    fused = [Hit(passage(5), 0.032), Hit(passage(1), 0.016), Hit(passage(9), 0.015)]
    ranked = reply_ranking(fused, stored, ReplyWindow(window=2, weight=0.5, keep=1))
    # 5 is kept first; 6 and 7 (its replies, found by neither side) score 0.016 each and,
    # newer, pass 1 (0.016) on the tie and 9 (0.015)
    assert [hit.passage.position for hit in ranked][:5] == [5, 7, 6, 1, 9]
    assert ranked[1].score == pytest.approx(0.016)
    assert ranked[1].next_text == "turn 8"


def test_a_reply_never_crosses_into_the_next_item():
    stored = [passage(5, item=1), passage(6, item=2)]
    ranked = reply_ranking([Hit(stored[0], 0.03)], stored, ReplyWindow())
    assert [hit.passage.position for hit in ranked] == [5]


@pytest.mark.parametrize("option", ["replies=2/0", "replies=0/0.5/3", "replies=2/x/3"])
def test_a_bad_reply_window_is_a_clear_error(option):
    with pytest.raises(ConfigurationError):
        parse_replies(option)


def test_the_hybrid_returns_the_reply_that_holds_the_answer_by_default():
    """The question matches the turn that asks; the answer is the turn after it, which shares
    no word with the question: the reply window brings it in, ``replies=None`` does not. (The
    embedding side keeps only near-exact matches here, so the keyword side alone finds.)"""
    turns = [
        (1, "Can you give me the recipe for the coconut ice cream?"),
        (1, "Sure thing! I can bring it to you tomorrow."),
        (2, "The weather was lovely at the lake."),
    ]
    found = {}
    for replies in (True, False):
        embedding = EmbeddingRetriever(embedder=HashingEmbedder(), min_score=0.99)
        hybrid = (
            HybridRetriever(KeywordRetriever(), embedding)
            if replies
            else HybridRetriever(KeywordRetriever(), embedding, replies=None)
        )
        hybrid.add([passage(i, item, text) for i, (item, text) in enumerate(turns)])
        hits = hybrid.search("What recipe for coconut ice cream?", session="s", k=2)
        found[replies] = [hit.passage.position for hit in hits]
        hybrid.close()
    assert found == {True: [0, 1], False: [0]}


def lookups(name, request):
    if name == "sqlite":
        return KeywordRetriever()
    url = request.getfixturevalue("postgres_url")
    return PostgresKeywordRetriever(url, schema=request.getfixturevalue("pg_schema"))


@pytest.mark.parametrize("name", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_the_keyword_index_returns_stored_passages_by_position(name, request):
    keyword = lookups(name, request)
    assert isinstance(keyword, PassageLookup)
    keyword.add([passage(p, item=p // 2) for p in range(4)])
    found = keyword.passages_at("s", [3, 1, 9])
    assert [(p.position, p.item, p.text) for p in found] == [(1, 0, "turn 1"), (3, 1, "turn 3")]
    assert keyword.passages_at("other", [1]) == []
    keyword.close()


def test_the_replies_options_run_end_to_end_and_say_their_setting(tmp_path):
    from tests.test_locomo import FACTS, sample

    path = tmp_path / "locomo.json"
    path.write_text(json.dumps([sample("conv-a", FACTS)]))
    assert "reply window: 2 passage(s) before lift by 0.5" in configuration(
        MethodSpec.parse("hybrid:hashing")
    )
    assert "no reply window" in configuration(MethodSpec.parse("hybrid:hashing:noreplies"))
    conversations = load_locomo(path)
    result = measure("hybrid:hashing:replies=2/1/3", conversations, {})
    assert result.questions == measure("hybrid:hashing:noreplies", conversations, {}).questions
    assert result.rate(10) == 1.0
