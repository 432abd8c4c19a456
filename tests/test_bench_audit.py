"""The memory audit finds a wrong value, and for how many batches it stayed wrong, in NOTES and
summaries alike."""

from __future__ import annotations

import pytest

from keeper_bench.audit import (
    MemoryVersion,
    NotesVersion,
    audit_memory,
    audit_notes,
    read_state_lines,
    summary_claims,
)
from keeper_bench.ledger import Ledger, LedgerChange


def _ledger() -> Ledger:
    """domo86: 342 at item 1, 332 at item 3; kelo12: 6 at item 2, then unchanged; 20 items."""
    ledger = Ledger()
    script = {
        1: [LedgerChange("domo86", "set", 342, None, "the clerk", 342)],
        2: [LedgerChange("kelo12", "set", 6, None, "Mira Holt", 6)],
        3: [LedgerChange("domo86", "take", 10, None, "Tomas Quill", 332)],
    }
    for item in range(1, 21):
        ledger.record(item, script.get(item, []))
    return ledger


def _notes(last: int, state: dict[str, str], *, extra: str = "") -> str:
    lines = [
        f"[NOTES] Kept by the context keeper. Covers items 1–{last}. Older turns are in the archive (search_archive).",
        "RULES",
        "- A counter's tally is its value times five plus thirteen.",
        "STATE",
        *(f"- {k} = {v}" for k, v in state.items()),
        "OPEN",
        extra,
    ]
    return "\n".join(lines)


def _version(number: int, last: int, state: dict[str, str]) -> NotesVersion:
    return NotesVersion(number, 1, last, _notes(last, state))


def test_notes_that_match_the_ledger_have_no_wrong_lines():
    versions = [
        _version(1, 2, {"domo86": "342", "kelo12": "6"}),
        _version(2, 5, {"domo86": "332", "kelo12": "6"}),
    ]
    result = audit_notes(versions, _ledger())
    assert (result.versions_audited, result.total_lines, result.wrong_lines) == (2, 4, ())
    assert result.counters_ever_wrong == [] and result.wrong_per_1000_lines == 0


def test_a_planted_wrong_value_is_found_with_the_batches_it_stayed_wrong():
    # The note-taker read "took ten from domo86" wrongly at item 3 and kept the value until item 12.
    versions = [
        _version(1, 2, {"domo86": "342", "kelo12": "6"}),
        _version(2, 4, {"domo86": "-742", "kelo12": "6"}),
        _version(3, 8, {"domo86": "-742", "kelo12": "6"}),
        _version(4, 12, {"domo86": "332", "kelo12": "6"}),
    ]
    result = audit_notes(versions, _ledger())
    assert result.counters_ever_wrong == ["domo86"]
    assert result.wrong_batches == {"domo86": 8}  # in force from item 4 until the version at 12
    assert result.wrong_stretches == {"domo86": [(4, 11)]}
    assert [(w.version, w.noted, w.true) for w in result.wrong_lines] == [
        (2, "-742", 332),
        (3, "-742", 332),
    ]
    assert result.wrong_per_1000_lines == pytest.approx(1000 * 2 / 8)


def test_a_wrong_value_in_the_last_version_lasts_to_the_end_of_the_stream():
    versions = [_version(1, 15, {"domo86": "333", "kelo12": "6"})]
    result = audit_notes(versions, _ledger())
    assert result.wrong_batches == {"domo86": 6}  # items 15..20


def test_a_counter_noted_before_the_stream_sets_it_is_wrong():
    result = audit_notes([_version(1, 1, {"domo86": "342", "kelo12": "6"})], _ledger())
    assert [(w.name, w.true) for w in result.wrong_lines] == [("kelo12", None)]


def test_lost_lines_are_counted_and_non_counter_keys_are_not_audited():
    versions = [_version(1, 5, {"domo86": "332", "progress": "item five done"})]
    result = audit_notes(versions, _ledger())
    assert result.total_lines == 1 and result.missing_lines == 1


def test_a_version_covering_no_items_is_skipped_and_the_header_gives_the_range():
    empty = NotesVersion(
        0,
        None,
        None,
        "[NOTES] Kept by the context keeper. Covers no items yet.\nRULES\nSTATE\nOPEN",
    )
    from_header = NotesVersion(1, None, None, _notes(3, {"domo86": "332"}))
    result = audit_notes([empty, from_header], _ledger())
    assert result.versions_audited == 1 and result.wrong_lines == ()


def test_state_lines_come_only_from_the_state_section():
    text = _notes(3, {"domo86": "332"}, extra="- kelo12 = 5")
    assert read_state_lines(text) == [("domo86", "332")]


def test_the_audit_table_names_the_reader():
    result = audit_notes([_version(1, 4, {"domo86": "1"})], _ledger())
    assert "simulated reader" in result.markdown("simulated reader").splitlines()[0]
    assert "| domo86 | 17 | 4–20 |" in result.markdown("simulated reader")


def test_versions_are_audited_one_at_a_time_from_any_iterable():
    versions = [_version(1, 2, {"domo86": "342"}), _version(2, 5, {"domo86": "999"})]
    streamed = audit_notes(iter(versions), _ledger())
    assert streamed == audit_notes(versions, _ledger())
    assert streamed.wrong_batches == {"domo86": 16}


def test_versions_out_of_order_are_an_error_that_names_them():
    versions = [_version(1, 5, {"domo86": "332"}), _version(2, 2, {"domo86": "342"})]
    with pytest.raises(ValueError, match="version 2 covers up to item 2"):
        audit_notes(versions, _ledger())


@pytest.mark.parametrize(
    ("summary", "claims"),
    [
        ("The clerk recorded domo86 at 332.", [("domo86", "332")]),
        ("The clerk recorded domo86 at three hundred and thirty-two.", [("domo86", "332")]),
        ("- domo86 = 332\n- kelo12: minus six", [("domo86", "332"), ("kelo12", "-6")]),
        ("domo86 holds 332 and kelo12 holds 6.", [("domo86", "332"), ("kelo12", "6")]),
        # history first, then the value now: the value now is the claim
        (
            "domo86 was set to 342 by Mira Holt in item 1. Ten were taken from domo86 in item 3. "
            "domo86 now holds 332.",
            [("domo86", "332")],
        ),
        # the value now first, then history: still the value now
        ("domo86 is now 332. Before item 3, domo86 was 342.", [("domo86", "332")]),
        # one line per change with its item, then the value after the last change
        (
            "item 1: The clerk recorded domo86 at 342.\nitem 3: Tomas Quill took 10 from domo86."
            "\nitem 3: domo86 stood at 332.\nitem 2: kelo12 stood at 6 (= 33 - 27).",
            [("domo86", "332"), ("kelo12", "6")],
        ),
        # a change states no value
        ("Ten were taken from domo86 by Tomas Quill.", []),
        ("Standing rule: any figure below zero is reported as overdrawn.", []),
    ],
)
def test_a_summary_is_read_as_one_claim_per_counter(summary, claims):
    assert summary_claims(summary) == claims


def _summary(number: int, last: int, text: str) -> MemoryVersion:
    return MemoryVersion(number, 1, last, text, kind="summary")


def test_summaries_are_audited_like_notes_a_stale_value_is_wrong_until_replaced():
    versions = [
        _summary(1, 2, "The clerk recorded domo86 at 342. The clerk recorded kelo12 at 6."),
        # item 3 took 10 from domo86; this summary still says 342: stale, so wrong
        _summary(2, 5, "The clerk recorded domo86 at 342. The clerk recorded kelo12 at 6."),
        _summary(3, 9, "The clerk recorded domo86 at 332. The clerk recorded kelo12 at 6."),
    ]
    result = audit_memory(versions, _ledger())
    as_notes = audit_notes(
        [
            _version(1, 2, {"domo86": "342", "kelo12": "6"}),
            _version(2, 5, {"domo86": "342", "kelo12": "6"}),
            _version(3, 9, {"domo86": "332", "kelo12": "6"}),
        ],
        _ledger(),
    )
    assert result.memory == "summary" and as_notes.memory == "notes"
    assert [(w.version, w.name, w.noted, w.true) for w in result.wrong_lines] == [
        (2, "domo86", "342", 332)
    ]
    assert result.wrong_batches == as_notes.wrong_batches == {"domo86": 4}
    assert result.total_lines == as_notes.total_lines == 6
    assert "Summary audit" in result.markdown("simulated reader")


def test_a_summary_that_drops_a_counter_has_a_missing_line_not_a_wrong_one():
    result = audit_memory([_summary(1, 5, "The clerk recorded domo86 at 332.")], _ledger())
    assert result.wrong_lines == () and result.missing_lines == 1


def test_one_audit_reads_one_memory():
    with pytest.raises(ValueError, match="one memory"):
        audit_memory([_version(1, 2, {"domo86": "342"}), _summary(2, 5, "domo86 = 332")], _ledger())


def test_a_memory_version_survives_json_and_refuses_an_unknown_kind():
    version = _summary(3, 9, "domo86 = 332")
    assert MemoryVersion.from_json(version.to_json()) == version
    with pytest.raises(ValueError, match="memory kind"):
        MemoryVersion.from_json({**version.to_json(), "kind": "diary"})


def test_summaries_are_read_one_at_a_time_too_and_out_of_order_is_an_error():
    versions = [_summary(1, 2, "domo86 = 342"), _summary(2, 5, "domo86 = 999")]
    streamed = audit_memory(iter(versions), _ledger())
    assert streamed == audit_memory(versions, _ledger())
    assert streamed.memory == "summary" and streamed.wrong_batches == {"domo86": 16}
    with pytest.raises(ValueError, match="Summary version 1 covers up to item 2"):
        audit_memory(reversed(versions), _ledger())
