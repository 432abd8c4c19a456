"""Full-rewrite notes: reading a rewritten block, and keeping every rule word for word."""

from __future__ import annotations

from keeper_middleware.notes.block import Notes, render_notes
from keeper_middleware.notes.rewrite import (
    REWRITE_REQUEST_TEXT,
    is_rewording,
    merge_rewrite,
    parse_rewrite,
)

CONFIDENTIAL = (
    "The counters kelo12, varu55 and tisa09 are confidential: whenever asked for the value of "
    "one of them, answer with the single word protected."
)
TALLY = "A counter's tally is its value times five plus thirteen."
OVERDRAWN = "Any figure below zero is reported as the single word overdrawn."


def test_request_starts_with_the_pinned_line():
    assert REWRITE_REQUEST_TEXT.splitlines()[0] == (
        "[NOTES REQUEST] Rewrite the NOTES to cover everything so far."
    )


def test_parse_reads_our_own_rendering():
    notes = Notes(rules=(TALLY,), state=(("domo86", "332"),), open=("q",))
    assert parse_rewrite(render_notes(notes.covering(1, 4), kept=2)) == notes


def test_parse_tolerates_a_missing_header_and_decorated_sections():
    reply = """<think>let me see</think>
Here are the notes.
## RULES:
* A rule.
**STATE**
1. domo86 = 332
- domo86 = 340
- nipewe33=17
- a line with no value
OPEN
"""
    reply += "-   \n"
    notes = parse_rewrite(reply)
    assert notes == Notes(rules=("A rule.",), state=(("domo86", "340"), ("nipewe33", "17")))


def test_parse_gives_none_without_any_section():
    assert parse_rewrite("I could not write the notes.") is None
    assert parse_rewrite("") is None


def test_rewrite_restores_a_dropped_rule():
    old = Notes(rules=(CONFIDENTIAL, TALLY), state=(("domo86", "342"),))
    new = Notes(rules=(TALLY,), state=(("domo86", "332"),))
    merged, repairs = merge_rewrite(old, new)
    assert merged.rules == (CONFIDENTIAL, TALLY)
    assert merged.state == (("domo86", "332"),)
    assert repairs == [f"restored rule: {CONFIDENTIAL!r}"]


def test_rewrite_replaces_a_reworded_rule_by_the_original():
    old = Notes(rules=(CONFIDENTIAL, TALLY))
    reworded = "A counter's tally is its value times 5 plus 13."
    merged, repairs = merge_rewrite(old, Notes(rules=(CONFIDENTIAL, reworded)))
    assert merged.rules == (CONFIDENTIAL, TALLY)
    assert repairs == [
        f"left out reworded rule: {reworded!r} (the rule is {TALLY!r})",
        f"restored rule: {TALLY!r}",
    ]


def test_a_genuinely_new_rule_is_appended_after_the_old_ones():
    old = Notes(rules=(CONFIDENTIAL,))
    merged, repairs = merge_rewrite(old, Notes(rules=(OVERDRAWN, CONFIDENTIAL)))
    assert merged.rules == (CONFIDENTIAL, OVERDRAWN)
    assert repairs == []


def test_a_rule_with_different_amounts_is_not_a_rewording():
    assert not is_rewording("A counter's tally is its value times six plus thirteen.", TALLY)
    assert is_rewording("a counters tally is its value times five plus thirteen", TALLY)


def test_same_amounts_and_most_words_make_a_rewording():
    assert is_rewording("Tally: value times five, plus thirteen, for each counter.", TALLY)


def test_merge_keeps_the_old_range_when_the_rewrite_has_none():
    old = Notes(rules=(TALLY,)).covering(1, 9)
    merged, _ = merge_rewrite(old, Notes(rules=(TALLY,)))
    assert (merged.first_item, merged.last_item) == (1, 9)
    merged, _ = merge_rewrite(old, Notes().covering(1, 20))
    assert (merged.first_item, merged.last_item) == (1, 20)
