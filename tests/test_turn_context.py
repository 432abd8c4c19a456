"""Every passage the keeper indexes carries its message's context: who wrote it, when (a date the
message states where a message says when it was written), and which item; a hit still shows the
message's own words."""

from __future__ import annotations

import pytest

from keeper_middleware import Keeper, KeeperConfig
from keeper_middleware.archive.records import ArchivedTurn
from keeper_middleware.retrievers.keyword import KeywordRetriever
from keeper_middleware.search.indexing import catch_up, turn_passages
from keeper_middleware.search.turn_context import stated_speaker_and_date, turn_context


def turn(content: str, *, role: str = "human", name: str | None = None, item: int | None = 3):
    return ArchivedTurn(
        session="s",
        msg_id=f"m{abs(hash(content))}",
        item=item,
        role=role,
        content=content,
        name=name,
    )


@pytest.mark.parametrize(
    ("content", "role", "name", "item", "context"),
    [
        (
            "Caroline (1:56 pm on 8 May, 2023): I went to the group. It was great.",
            "human",
            None,
            3,
            "Caroline (1:56 pm on 8 May, 2023), item 3",
        ),
        (
            "[2023-05-08 13:56] Mel: Sounds good.",
            "human",
            None,
            1,
            "Mel (2023-05-08 13:56), item 1",
        ),
        ("[May 8, 2023] We met again.", "ai", None, 1, "assistant (May 8, 2023), item 1"),
        (
            "Item 3. Session 3 (1:56 pm on 8 May, 2023):\nCaroline: hi\nMel: hello",
            "human",
            None,
            3,
            "user (1:56 pm on 8 May, 2023), item 3",
        ),
        ("See you at noon.", "human", "Caroline", 2, "Caroline, item 2"),
        ("Done.", "ai", None, None, "assistant"),
        ("shelf 4", "tool", "lookup", 7, "tool lookup, item 7"),
        ("Start.", "system", None, None, "system"),
        # a parenthesis that holds no date is not a header: the words stay the words
        ("Caroline (the teacher): hello", "human", None, 1, "user, item 1"),
        ("On 8 May, 2023 we met.\nThen we left.", "human", None, 1, "user, item 1"),
    ],
)
def test_the_context_says_who_when_and_which_item(content, role, name, item, context):
    assert turn_context(turn(content, role=role, name=name, item=item)) == context


def test_a_date_inside_the_text_is_not_taken_for_when_it_was_written():
    assert stated_speaker_and_date("We will meet on 9 June, 2023. Bring the map.") == ("", "")


@pytest.mark.parametrize("unit", ["messages", "sentences"])
def test_every_passage_of_a_message_carries_its_context_and_shows_its_own_words(unit):
    text = "Caroline (8 May, 2023): I went to the group. The painting showed a sunset. Bye!"
    passages = turn_passages(turn(text), unit, 10)
    assert passages and all(p.context == "Caroline (8 May, 2023), item 3" for p in passages)
    assert " ".join(p.text for p in passages) == text  # word for word, nothing added
    assert [p.position for p in passages] == list(range(10, 10 + len(passages)))


def test_search_results_are_not_indexed():
    result = ArchivedTurn(
        session="s",
        msg_id="r",
        item=1,
        role="tool",
        content="item 1: c1 was 3",
        name="search_archive",
    )
    assert turn_passages(result, "messages", 0) == []


def test_the_keeper_indexes_the_speaker_for_every_sentence_not_only_the_first():
    keeper = Keeper(KeeperConfig(passages="sentences"))
    turns = [
        turn("Melanie (8 May, 2023): We walked a long way. The sunset was orange.", item=1),
        turn("Caroline (9 May, 2023): I stayed in. The sunset was pink from my window.", item=2),
    ]
    keeper.archive.commit_cut("s", cut_key="c1", turns=turns, notes=None)
    catch_up(keeper.archive, "s", (keeper.retriever,), unit="sentences")
    hits = keeper.retriever.search("What did Melanie say about the sunset?", session="s", k=1)
    assert hits[0].passage.text == "The sunset was orange."  # its own words; the speaker indexed
    shown = keeper.search("s", "Melanie sunset")
    assert "item 1: The sunset was orange." in shown
    keeper.close()


def test_the_migration_and_the_keeper_make_the_same_passages(tmp_path):
    turns = [turn(f"Mel (8 May, 2023): line {i}. And more {i}.", item=i) for i in range(1, 4)]
    indexes = []
    for name in ("a", "b"):
        keeper = Keeper(KeeperConfig(), archive=tmp_path / f"{name}.sqlite3")
        keeper.archive.commit_cut("s", cut_key="c1", turns=turns, notes=None)
        keeper.indexing.ready("s") if name == "a" else catch_up(
            keeper.archive, "s", (keeper.retriever,)
        )
        keeper.close()
        index = KeywordRetriever(tmp_path / f"{name}.index" / "keyword.sqlite3")
        indexes.append(
            [(h.passage.position, h.passage.context) for h in index.search("mel line", session="s")]
        )
        index.close()
    assert indexes[0] == indexes[1] and indexes[0]
