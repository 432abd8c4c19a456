"""Change lines (docs/formats.md §2): reading a reply and applying it to the notes."""

from __future__ import annotations

import pytest

from keeper_middleware.notes.block import Notes
from keeper_middleware.notes.changes import (
    CloseLine,
    NoChanges,
    OpenLine,
    RuleLine,
    SetLine,
    UnsetLine,
    apply_changes,
    parse_change_line,
    parse_changes,
    unapplied,
)


@pytest.mark.parametrize(
    ("line", "change"),
    [
        ("RULE: Answer protected.", RuleLine("Answer protected.")),
        ("SET domo86 = 6", SetLine("domo86", "6")),
        ("SET domo86 = 332 (= 342 - 10)", SetLine("domo86", "332", "342 - 10")),
        ("UNSET domo86", UnsetLine("domo86")),
        ("OPEN: Question 3 is not answered yet.", OpenLine("Question 3 is not answered yet.")),
        ("CLOSE: Question 3", CloseLine("Question 3")),
        ("NO CHANGES", NoChanges()),
    ],
)
def test_each_canonical_line_parses_and_renders_back(line, change):
    assert parse_change_line(line) == change
    assert change.render() == line


@pytest.mark.parametrize(
    "line",
    [
        "- SET domo86 = 6",
        "* SET domo86 = 6",
        "1. SET domo86 = 6",
        "12) SET domo86 = 6",
        "`SET domo86 = 6`",
        "- `set domo86 = 6`",
        "Set domo86=6",
        "**SET domo86 = 6**",
    ],
)
def test_decorated_lines_are_read(line):
    assert parse_change_line(line) == SetLine("domo86", "6")


def test_keywords_are_case_insensitive():
    assert parse_change_line("rule: keep it") == RuleLine("keep it")
    assert parse_change_line("No changes.") == NoChanges()
    assert parse_change_line("unset a") == UnsetLine("a")
    assert parse_change_line("close: x") == CloseLine("x")


def test_working_is_the_last_bracket_that_ends_the_line():
    assert parse_change_line("SET a = 7 (= (2 + 3) * 2 - 3)") == SetLine(
        "a", "7", "(2 + 3) * 2 - 3"
    )
    assert parse_change_line("SET a = 5 (= 2 + 3) (= 5)") == SetLine("a", "5 (= 2 + 3)", "5")


def test_a_bracket_without_equals_belongs_to_the_value():
    assert parse_change_line("SET a = 5 (estimated)") == SetLine("a", "5 (estimated)")


def test_a_final_period_ends_the_sentence_not_the_value():
    assert parse_change_line("SET a = 6.") == SetLine("a", "6")
    assert parse_change_line("SET a = 332 (= 342 - 10).") == SetLine("a", "332", "342 - 10")
    assert parse_change_line("SET owner = Mira S.") == SetLine("owner", "Mira S.")
    assert parse_change_line("UNSET domo86.") == UnsetLine("domo86")


def test_value_may_contain_equals_signs():
    assert parse_change_line("SET formula = a = b") == SetLine("formula", "a = b")


@pytest.mark.parametrize(
    "line",
    [
        "SET = 4",
        "SET a =",
        "SET a = 4 (= )",
        "UNSET",
        "RULE:",
        "Here are my changes:",
        "domo86 = 6",
    ],
)
def test_lines_that_match_no_form_are_not_changes(line):
    assert parse_change_line(line) is None


def test_garbage_lines_are_kept_aside_and_counted():
    reply = "Sure! Here you go:\nSET a = 1\n\nThat is all.\n"
    parsed = parse_changes(reply)
    assert parsed.changes == (SetLine("a", "1"),)
    assert parsed.garbage == ("Sure! Here you go:", "That is all.")
    assert parsed.usable


def test_code_fences_are_neither_changes_nor_garbage():
    parsed = parse_changes("```text\nSET a = 1\nRULE: r\n```")
    assert parsed.changes == (SetLine("a", "1"), RuleLine("r"))
    assert parsed.garbage == ()


def test_thinking_is_stripped_before_reading():
    reply = "<think>SET a = 999 (= maybe)\nhmm</think>\nSET a = 1"
    assert parse_changes(reply).changes == (SetLine("a", "1"),)


def test_thinking_that_never_closed_leaves_nothing_usable():
    parsed = parse_changes("<think>SET a = 2 ... still thinking")
    assert not parsed.usable
    assert parsed.garbage == ()


def test_a_reply_showing_only_the_closing_tag_is_read_after_it():
    assert parse_changes("reasoning SET a = 3\n</think>\nSET a = 4").changes == (SetLine("a", "4"),)


def test_empty_reply_is_not_usable_but_no_changes_is():
    assert not parse_changes("").usable
    assert not parse_changes("I could not find anything.").usable
    assert parse_changes("NO CHANGES").usable


BASE = Notes(
    rules=("A counter's tally is its value times five plus thirteen.",),
    state=(("domo86", "342"), ("nipewe33", "17")),
    open=("Questions 3 and 4 of the item 40 set are not answered yet.", "Check item 41."),
)


def test_set_replaces_a_value_where_it_stands_and_appends_new_keys():
    notes = apply_changes(BASE, [SetLine("domo86", "332", "342 - 10"), SetLine("katu85", "523")])
    assert notes.state == (("domo86", "332"), ("nipewe33", "17"), ("katu85", "523"))


def test_unset_removes_and_entries_not_mentioned_are_kept():
    notes = apply_changes(BASE, [UnsetLine("domo86")])
    assert notes.state == (("nipewe33", "17"),)
    assert notes.rules == BASE.rules
    assert notes.open == BASE.open


def test_rules_are_added_once_and_never_reworded():
    notes = apply_changes(
        BASE,
        [
            RuleLine("a counter's tally is its value times five  plus thirteen"),
            RuleLine("Any figure below zero is reported as the single word overdrawn."),
            RuleLine("Any figure below zero is reported as the single word overdrawn"),
        ],
    )
    assert notes.rules == (
        "A counter's tally is its value times five plus thirteen.",
        "Any figure below zero is reported as the single word overdrawn.",
    )


def test_open_is_appended_once():
    notes = apply_changes(BASE, [OpenLine("Check item 41"), OpenLine("Ask about item 50.")])
    assert notes.open == (*BASE.open, "Ask about item 50.")


@pytest.mark.parametrize(
    "text",
    [
        "Questions 3 and 4 of the item 40 set are not answered yet.",
        "questions 3 and 4 of the item 40 set are not answered yet",
        "Questions 3 and 4",
    ],
)
def test_close_matches_exact_text_or_a_unique_prefix(text):
    notes = apply_changes(BASE, [CloseLine(text)])
    assert notes.open == ("Check item 41.",)
    assert unapplied(BASE, [CloseLine(text)]) == []


def test_close_that_matches_nothing_or_is_ambiguous_is_ignored_and_reported():
    notes = Notes(open=("Check item 41.", "Check item 42."))
    changes = [CloseLine("Check item"), CloseLine("Something else")]
    assert apply_changes(notes, changes) == notes
    assert unapplied(notes, changes) == changes


def test_unset_of_an_absent_key_is_reported():
    assert unapplied(BASE, [UnsetLine("ghost")]) == [UnsetLine("ghost")]


def test_changes_apply_in_order_and_no_changes_changes_nothing():
    notes = apply_changes(BASE, [SetLine("x", "1"), UnsetLine("x"), NoChanges()])
    assert notes == BASE
    assert unapplied(BASE, [SetLine("x", "1"), UnsetLine("x")]) == []


def test_apply_does_not_touch_its_input():
    before = Notes(state=(("a", "1"),))
    apply_changes(before, [SetLine("a", "2")])
    assert before.state == (("a", "1"),)
