"""The reader's shortcuts read exactly what the plain reading reads: a remembered parse, context
rot planned once per text, and the sign check's look for "minus" before an amount."""

from __future__ import annotations

import random

import pytest

from keeper_bench.reader.rot import ContextRot, _can_rot, _pieces, rotted_text
from keeper_bench.reader.text import Event, Recount, read_events, read_text
from keeper_bench.streams import generate_stream, preset_spec, read_stream
from keeper_middleware.notes.signs import _MINUS_BEFORE, _minus_before, signed_amounts_in


@pytest.fixture(scope="module")
def batches(tmp_path_factory):
    texts: list[str] = []
    for seed, families in ((1, "rules+overdrawn+varied"), (4, "harder+varied")):
        folder = tmp_path_factory.mktemp(f"stream{seed}")
        spec = preset_spec("tiny", seed=seed, families=frozenset({"base", *families.split("+")}))
        generate_stream(spec, folder)
        texts += [r["text"] for r in read_stream(folder) if r.get("type") == "batch"]
    return texts


def test_a_remembered_reading_cannot_be_changed_by_its_caller():
    text = "Next on the list was domo86. Mira Holt recorded it at 12. Ada Lee took 3 from it."
    first = read_events(text)
    first.append(Event("set", "kite32", 1, None, "x"))
    first[0] = Event("set", "domo86", -12, None, "Mira Holt")
    assert read_events(text) == [
        Event("set", "domo86", 12, None, "Mira Holt"),
        Event("take", "domo86", 3, None, "Ada Lee"),
    ]


def test_a_recount_left_open_is_part_of_what_is_remembered():
    text = "The recount begun in the previous item came to 40."
    assert read_text(text, None) == ([], None)
    assert read_text(text, Recount("domo86", "Ada Lee")) == (
        [Event("set", "domo86", 40, None, "Ada Lee")],
        None,
    )


def _plain_rot(text: str, after: int, rot: ContextRot) -> str:
    """Rot as first written: every piece hashed on every request."""
    kept, seen, cursor = [], {}, 0
    for start, piece in _pieces(text, "input"):
        occurrence = seen.get(piece, 0)
        seen[piece] = occurrence + 1
        distance = after + (len(text) - start + 3) // 4
        kept.append(text[cursor:start])
        if not (_can_rot(piece, "input") and rot.overlooks(piece, occurrence, distance)):
            kept.append(piece)
        cursor = start + len(piece)
    kept.append(text[cursor:])
    return "".join(kept)


@pytest.mark.parametrize("seed", [0, 3, 11])
def test_rot_planned_once_per_text_overlooks_what_rot_on_every_request_did(batches, seed):
    rot = ContextRot(rate=0.6, length=2_000, seed=seed)
    overlooked = 0
    for text in batches:
        for after in (0, 700, 1_900, 9_000):
            seen = rotted_text(text, "input", after, rot)
            assert seen == _plain_rot(text, after, rot)
            overlooked += seen != text
    assert overlooked > len(batches)  # rot did overlook sentences, far back most of all


def test_the_minus_before_an_amount_is_found_as_a_search_of_everything_before_it_finds_it():
    pieces = ["minus", "Negative", "MINUS", " ", "\n", "\t", "x", "5", "nega", "tive", "\u00a0"]
    generator = random.Random(7)
    for _ in range(20_000):
        text = "".join(generator.choice(pieces) for _ in range(generator.randint(0, 8)))
        for end in range(len(text) + 1):
            expected = _MINUS_BEFORE.search(text[:end]) is not None
            assert _minus_before(text, end) is expected, (text, end)


def test_signed_amounts_keep_their_written_sign():
    assert signed_amounts_in("It fell to minus six, then to negative  12 and rose to 4.") == {
        -6.0,
        -12.0,
        4.0,
    }
    assert signed_amounts_in("no amount here") == frozenset()
