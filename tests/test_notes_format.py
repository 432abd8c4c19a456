"""The NOTES message: docs/formats.md §1, rendered and read back."""

from __future__ import annotations

import pytest

from keeper_middleware.notes.block import NOTES_TAG, Notes, parse_notes, render_notes

FORMATS_EXAMPLE = """\
[NOTES] Kept by the context keeper. Covers items 1–40. Older turns are in the archive (search_archive).
RULES
- The counters kelo12, varu55 and tisa09 are confidential: whenever asked for the value of one of them, answer with the single word protected.
- A counter's tally is its value times five plus thirteen.
STATE
- domo86 = 332
- nipewe33 = 17
OPEN
- Questions 3 and 4 of the item 40 set are not answered yet.
(The next 2 messages were kept in view from before these notes; they are already noted.)"""

EXAMPLE_NOTES = Notes(
    rules=(
        "The counters kelo12, varu55 and tisa09 are confidential: whenever asked for the value of one of them, answer with the single word protected.",
        "A counter's tally is its value times five plus thirteen.",
    ),
    state=(("domo86", "332"), ("nipewe33", "17")),
    open=("Questions 3 and 4 of the item 40 set are not answered yet.",),
    first_item=1,
    last_item=40,
)


def test_render_matches_the_documented_example_exactly():
    assert render_notes(EXAMPLE_NOTES, kept=2) == FORMATS_EXAMPLE


def test_parse_reads_the_documented_example():
    assert parse_notes(FORMATS_EXAMPLE) == (EXAMPLE_NOTES, 2)


def test_empty_notes_show_every_section_and_no_range():
    assert render_notes(Notes()) == (
        "[NOTES] Kept by the context keeper. Covers no items yet. Older turns are in the "
        "archive (search_archive).\nRULES\nSTATE\nOPEN"
    )


def test_single_item_range_and_single_kept_message_read_naturally():
    text = render_notes(Notes().covering(7, 7), kept=1)
    assert "Covers item 7." in text
    assert text.endswith(
        "(The next message was kept in view from before these notes; it is already noted.)"
    )
    assert parse_notes(text) == (Notes(first_item=7, last_item=7), 1)


def test_header_uses_an_en_dash():
    assert "Covers items 3–9." in render_notes(Notes().covering(3, 9))


@pytest.mark.parametrize(
    ("notes", "kept"),
    [
        (Notes(), 0),
        (EXAMPLE_NOTES, 0),
        (EXAMPLE_NOTES, 5),
        (Notes(state=(("formula", "a = b + c"), ("x", "= 4"))), 0),
        (Notes(rules=("Réponds « protégé » — toujours.",), state=(("名前", "値 = 3"),)), 1),
        (Notes(open=("- a dash-led task",), state=(("k=", "v"),)).covering(0, 0), 3),
    ],
)
def test_render_parse_render_is_identical(notes, kept):
    text = render_notes(notes, kept=kept)
    parsed, parsed_kept = parse_notes(text)
    assert (parsed, parsed_kept) == (notes, kept)
    assert render_notes(parsed, kept=parsed_kept) == text


def test_state_values_are_split_on_the_first_separator():
    text = render_notes(Notes(state=(("rule", "x = y = z"),)))
    notes, _ = parse_notes(text)
    assert notes.state_value("rule") == "x = y = z"


def test_state_keeps_insertion_order_and_helpers_read_it():
    notes = Notes(state=(("zeta", "1"), ("alpha", "2")))
    assert list(notes.state_dict()) == ["zeta", "alpha"]
    assert notes.state_value("alpha") == "2"
    assert notes.state_value("missing") is None
    assert not notes.is_empty
    assert Notes().covering(1, 2).is_empty


def test_covering_returns_a_copy():
    notes = Notes(rules=("r",))
    covered = notes.covering(4, 9)
    assert (notes.first_item, covered.first_item, covered.last_item) == (None, 4, 9)
    assert covered.rules == notes.rules


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"state": (("a", "1"), ("a", "2"))}, "appears twice"),
        ({"state": (("a = b", "1"),)}, "' = '"),
        ({"rules": ("two\nlines",)}, "one line"),
        ({"open": ("",)}, "non-empty"),
        ({"rules": (" padded",)}, "whitespace"),
        ({"first_item": 3}, "both first_item and last_item"),
        ({"first_item": 5, "last_item": 2}, "not a range"),
    ],
)
def test_invalid_notes_are_refused_with_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Notes(**kwargs)


def test_negative_kept_count_is_refused():
    with pytest.raises(ValueError, match="kept must be >= 0"):
        render_notes(Notes(), kept=-1)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("RULES\n- r", "Not a NOTES message"),
        (f"{NOTES_TAG} Kept by the context keeper. Older turns.", "no item range"),
        (render_notes(Notes()) + "\nstray line", "stray line"),
        (render_notes(Notes()).replace("STATE", "STATE\n- no separator"), "no ' = '"),
        (render_notes(Notes(), kept=2) + "\nOPEN", "follows the kept-messages line"),
    ],
)
def test_parse_refuses_what_it_cannot_read_and_names_the_line(text, message):
    with pytest.raises(ValueError, match=message):
        parse_notes(text)


def test_parse_tolerates_trailing_whitespace_and_blank_lines():
    text = render_notes(EXAMPLE_NOTES).replace("\n", "  \n") + "\n\n"
    assert parse_notes(text) == (EXAMPLE_NOTES, 0)


def test_notes_round_trip_through_json():
    from keeper_middleware.notes.block import notes_from_json, notes_to_json

    notes = Notes(
        rules=("Rule: ünïcode.",),
        state=(("a", "1"), ("b", "x = y")),
        open=("q?",),
        first_item=1,
        last_item=9,
    )
    assert notes_from_json(notes_to_json(notes)) == notes
