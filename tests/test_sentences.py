"""Sentence splitting: benchmark text, ordinary prose, lists and code."""

import pytest

from keeper_middleware.retrievers.base import Passage
from keeper_middleware.retrievers.sentences import (
    MAX_PASSAGE_CHARS,
    has_searchable_text,
    passages_from_text,
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


@pytest.mark.parametrize(
    ("query", "searchable"), [("domo86", True), ("?!", False), ("", False), ("é", True)]
)
def test_only_queries_with_a_word_are_searchable(query, searchable):
    assert has_searchable_text(query) is searchable
