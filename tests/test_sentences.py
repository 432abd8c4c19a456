"""Sentence splitting: benchmark text, ordinary prose, lists and code."""

import random
import re

import pytest

from keeper_middleware.retrievers.base import Passage
from keeper_middleware.retrievers.passages import passages_of
from keeper_middleware.retrievers.sentences import (
    MAX_PASSAGE_CHARS,
    has_searchable_text,
    long_sentences,
    passages_from_text,
    sentence_groups,
    split_sentences,
)


def test_benchmark_story_splits_into_its_sentences():
    text = (
        "The clerk recorded domo86 at three hundred and forty-two. Ten were taken from it. "
        "Mira took ten from domo86. The rain kept on."
    )
    assert split_sentences(text) == [
        "The clerk recorded domo86 at three hundred and forty-two.",
        "Ten were taken from it.",
        "Mira took ten from domo86.",
        "The rain kept on.",
    ]


def test_a_sentence_starting_with_a_lowercase_name_with_digits_is_its_own():
    assert split_sentences("Ten were taken. domo86 was lost. kalo7 was found.") == [
        "Ten were taken.",
        "domo86 was lost.",
        "kalo7 was found.",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Mr. Smith met Dr. Jones. They talked.", ["Mr. Smith met Dr. Jones.", "They talked."]),
        (
            "Bring fruit, e.g. apples or pears. Then go.",
            ["Bring fruit, e.g. apples or pears.", "Then go."],
        ),
        ("Use tools, i.e. hammers. Fine.", ["Use tools, i.e. hammers.", "Fine."]),
        ("It cost 3.5 dollars. Then 4.25 more.", ["It cost 3.5 dollars.", "Then 4.25 more."]),
        ("J. R. Tolkien wrote it. Yes.", ["J. R. Tolkien wrote it.", "Yes."]),
        ("Apples, pears, etc. All were sold.", ["Apples, pears, etc.", "All were sold."]),
        ("He waited... and waited. Nothing.", ["He waited... and waited.", "Nothing."]),
        ("He waited... Nobody came.", ["He waited...", "Nobody came."]),
        ("Wait… Who is there?", ["Wait…", "Who is there?"]),
        ('"Stop!" she said. He stopped.', ['"Stop!" she said.', "He stopped."]),
        ('He said "Go home." Then he left.', ['He said "Go home."', "Then he left."]),
        ("Is it? Yes! Good.", ["Is it?", "Yes!", "Good."]),
        ("See approx. five of them. Done.", ["See approx. five of them.", "Done."]),
    ],
)
def test_prose_is_cut_at_sentence_ends_only(text, expected):
    assert split_sentences(text) == expected


def test_newlines_are_hard_breaks_and_blank_lines_vanish():
    text = "Shopping list\n\n- eggs\n- flour and sugar\n1. First step\n2. Second step"
    assert split_sentences(text) == [
        "Shopping list",
        "- eggs",
        "- flour and sugar",
        "1. First step",
        "2. Second step",
    ]


def test_a_line_of_code_is_one_passage_even_with_periods_inside():
    text = (
        "Call it like this:\n"
        "```python\n"
        "result = client.fetch(url). Then parse(result)\n"
        "x = 1. Total\n"
        "```\n"
        "def main() -> None:\n"
        "    value = os.path.join(a, b). Strip it\n"
    )
    assert split_sentences(text) == [
        "Call it like this:",
        "result = client.fetch(url). Then parse(result)",
        "x = 1. Total",
        "def main() -> None:",
        "value = os.path.join(a, b). Strip it",
    ]


def test_a_long_line_without_punctuation_is_cut_on_word_boundaries():
    words = [f"word{i}" for i in range(300)]
    passages = split_sentences(" ".join(words))
    assert len(passages) > 1
    assert all(len(p) <= MAX_PASSAGE_CHARS for p in passages)
    assert " ".join(passages).split() == words  # nothing lost, no word split


def test_a_single_token_longer_than_a_passage_is_cut_without_loss():
    token = "x" * (2 * MAX_PASSAGE_CHARS + 10)
    passages = split_sentences(f"start {token} end")
    assert all(len(p) <= MAX_PASSAGE_CHARS for p in passages)
    assert "".join(p.replace(" ", "") for p in passages) == f"start{token}end"


def test_unicode_text_splits_and_keeps_its_characters():
    assert split_sentences("Zoë paid 5 €. Ärger folgte. 東京は晴れ。") == [
        "Zoë paid 5 €.",
        "Ärger folgte. 東京は晴れ。",
    ]


def test_empty_and_whitespace_give_no_passages():
    assert split_sentences("") == []
    assert split_sentences(" \n\t\n ") == []


def test_passages_are_numbered_from_the_start_position_under_one_item():
    passages = passages_from_text("s1", 7, "Ten were taken. The rain kept on.", 40)
    assert passages == [
        Passage(session="s1", item=7, position=40, text="Ten were taken."),
        Passage(session="s1", item=7, position=41, text="The rain kept on."),
    ]


def test_every_sentence_of_an_input_carries_its_context_into_the_index():
    context = "Ada (8 May 2023)"
    passages = passages_of(
        "sentences", "s1", 7, "Ten were taken. The rain kept on.", 0, context=context
    )
    assert [p.context for p in passages] == [context, context]
    assert passages[1].indexed_text == f"{context}: The rain kept on."


@pytest.mark.parametrize(
    ("query", "searchable"), [("domo86", True), ("?!", False), ("", False), ("é", True)]
)
def test_only_queries_with_a_word_are_searchable(query, searchable):
    assert has_searchable_text(query) is searchable


WORDS = ["thanks", "wow", "river", "lamp", "orchard", "ladder", "violin", "harbour", "pepper"]


def words_in(text: str) -> int:
    return len(re.findall(r"\w+", text))


def random_sentences(rng: random.Random) -> list[str]:
    return [
        " ".join(rng.choices(WORDS, k=rng.randrange(0, 12))).capitalize() + "!"
        for _ in range(rng.randrange(0, 9))
    ]


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("min_words", [1, 3, 6, 16])
def test_sentence_groups_cover_every_sentence_once_in_order_with_enough_words(seed, min_words):
    sentences = random_sentences(random.Random(seed))
    groups = sentence_groups(sentences, min_words)
    assert " ".join(text for _, text in groups) == " ".join(sentences)
    firsts = [first for first, _ in groups]
    assert firsts == sorted(set(firsts)) and (not groups or firsts[0] == 0)
    ends = [*firsts[1:], len(sentences)] if groups else []
    for (first, text), after in zip(groups, ends, strict=True):
        assert text == " ".join(sentences[first:after])  # each group its own run of sentences
    if len(groups) > 1:  # only a whole message shorter than min_words makes a short group
        assert all(words_in(text) >= min_words for _, text in groups)


def test_an_interjection_joins_the_statement_after_it_and_a_short_rest_the_one_before():
    sentences = ["Thanks, Mel!", "I went to the support group on Sunday.", "It was great.", "Wow!"]
    assert sentence_groups(sentences, 4) == [
        (0, "Thanks, Mel! I went to the support group on Sunday."),
        (2, "It was great. Wow!"),
    ]
    assert sentence_groups(sentences, 6) == [(0, " ".join(sentences))]
    assert sentence_groups(sentences, 1) == list(enumerate(sentences))
    assert sentence_groups(["Hi!", "Yo!"], 6) == [(0, "Hi! Yo!")]
    assert sentence_groups([], 6) == []


def test_long_sentences_keep_their_own_index():
    sentences = ["Thanks, Mel!", "I went to the support group on Sunday.", "Wow!"]
    assert long_sentences(sentences, 3) == [(1, sentences[1])]
    assert long_sentences(sentences, 1) == list(enumerate(sentences))


@pytest.mark.parametrize("min_words", [0, -2])
def test_a_group_needs_a_positive_word_count(min_words):
    with pytest.raises(ValueError, match="min_words"):
        sentence_groups(["One."], min_words)
