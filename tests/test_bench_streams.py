"""The generator: deterministic, true to the pinned wording, and its ledger re-derivable from the text.

The ledger check uses a second, independent parser written here (plain string handling and its
own number words), so a bug in phrasing.py cannot hide a matching bug in the ledger.
"""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from keeper_middleware.bench.ledger import Ledger
from keeper_middleware.bench.phrasing import apply_change, read_events, read_rules
from keeper_middleware.bench.questions import bucket_label
from keeper_middleware.bench.story import check_vocabulary
from keeper_middleware.bench.streams import (
    StreamSpec,
    generate_stream,
    history_tokens_by_item,
    preset_spec,
    read_stream,
)

ALL = frozenset({"base", "rules", "overdrawn", "harder", "adversarial"})

# -- a second parser, independent of phrasing.py ------------------------------------------------
_SMALL = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
_TENS = {
    w: 10 * i
    for i, w in enumerate(
        ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
    )
    if w != "_"
}


def _number(text: str) -> int:
    text = text.lower()
    if text.lstrip("-").isdigit():
        return int(text)
    total = 0
    if " hundred" in text:
        head, _, text = text.partition(" hundred")
        total = _SMALL.index(head) * 100
        text = text.removeprefix(" and ").strip()
    if text:
        tens, _, unit = text.partition("-")
        total += (
            _TENS[tens] + (_SMALL.index(unit) if unit else 0)
            if tens in _TENS
            else _SMALL.index(tens)
        )
    return total


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=\.)\s+", text.split("\n", 1)[1]) if s]


def _derive(text: str, values: dict[str, int]) -> list[tuple[str, int, str]]:
    """Apply one batch's sentences to ``values``; return (name, value after, actor) per change."""
    done: list[tuple[str, int, str]] = []
    antecedent = ""
    for sentence in _sentences(text):
        s = sentence[:-1]
        name = next((w for w in s.replace(",", "").split() if re.fullmatch(r"[a-z]+\d\d", w)), None)
        if s.startswith("Standing rule") or s.startswith("House method"):
            continue
        if s.startswith("Next on the list was "):
            antecedent = s.rsplit(" ", 1)[1]
            continue
        if name is None and not s.endswith(" it") and " recorded it at " not in s:
            continue
        if " as much as " in s:  # "{Actor} added to X as much as Y held"
            head, _, rest = s.partition(" as much as ")
            other = rest.removesuffix(" held")
            actor, verb = (
                head.split(" added to " if " added to " in head else " took from ")[0],
                head,
            )
            target = verb.rsplit(" ", 1)[1]
            sign = 1 if " added to " in head else -1
            values[target] += sign * values[other]
            done.append((target, values[target], actor))
            continue
        for marker, kind in ((" recorded ", "set"), (" added ", "add"), (" took ", "take")):
            if marker in s and not s.startswith("The clerk") and " were " not in s:
                actor, _, rest = s.partition(marker)
                if rest.startswith("it at "):
                    target, amount = antecedent, rest.removeprefix("it at ")
                elif kind == "set":
                    target, amount = rest.split(" at ")
                else:
                    amount, target = rest.split(" to " if kind == "add" else " from ")
                    target = antecedent if target == "it" else target
                break
        else:
            if s.startswith("The clerk recorded "):
                kind, actor = "set", "the clerk"
                target, amount = s.removeprefix("The clerk recorded ").split(" at ")
            elif " was set to " in s:
                kind = "set"
                target, rest = s.split(" was set to ")
                amount, actor = rest.split(" by ")
            elif " were added to " in s or " were taken from " in s:
                kind = "add" if " were added to " in s else "take"
                amount, rest = s.split(" were added to " if kind == "add" else " were taken from ")
                target, actor = rest.split(" by ")
            elif " lost " in s:
                kind = "take"
                target, rest = s.split(" lost ")
                amount, rest = rest.split(" when ")
                actor = rest.removesuffix(" dropped a crate")
            elif " regained " in s:
                kind = "add"
                target, rest = s.split(" regained ")
                amount, actor = rest.split(" thanks to ")
            else:
                raise AssertionError(
                    f"a sentence with a counter name matches no template: {sentence!r}"
                )
        n = _number(amount)
        values[target] = n if kind == "set" else values[target] + (n if kind == "add" else -n)
        done.append((target, values[target], actor))
    return done


@pytest.fixture(scope="module")
def hard_stream(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hard")
    spec = StreamSpec(
        seed=3, target_tokens=60_000, families=ALL, question_every=10, filler_sentences=(10, 20)
    )
    return folder, generate_stream(spec, folder)


def test_the_ledger_is_what_the_text_says_by_an_independent_reading(hard_stream):
    folder, _ = hard_stream
    ledger = Ledger.load(folder)
    values: dict[str, int] = {}
    for record in read_stream(folder):
        if record["type"] != "batch":
            continue
        item = record["item"]
        derived = _derive(record["text"], values)
        recorded = [(c.name, c.value, c.actor) for c in ledger.changes_in(item)]
        assert derived == recorded, f"item {item}"
        assert ledger.snapshot(item) == values, f"item {item}"


def test_the_same_seed_writes_the_same_bytes_and_another_seed_does_not(tmp_path):
    def digest(seed: int, name: str) -> str:
        folder = tmp_path / name
        generate_stream(
            StreamSpec(seed=seed, target_tokens=8_000, families=ALL, filler_sentences=(5, 9)),
            folder,
        )
        return hashlib.sha256(
            b"".join(
                (folder / f).read_bytes() for f in ("stream.jsonl", "ledger.jsonl", "spec.json")
            )
        ).hexdigest()

    assert digest(7, "a") == digest(7, "b")
    assert digest(7, "a") != digest(8, "c")


def test_filler_states_no_amount_and_no_name():
    assert check_vocabulary() == []


def test_every_question_records_its_distance_bucket_and_a_true_answer(hard_stream):
    folder, info = hard_stream
    ledger = Ledger.load(folder)
    sets = [r for r in read_stream(folder) if r["type"] == "questions"]
    assert sum(len(s["questions"]) for s in sets) == info.questions
    assert sets[-1]["final"] and sets[-1]["text"].startswith("Final questions.")
    for record in sets:
        after = record["after_item"]
        for q in record["questions"]:
            assert q["distance"] == (None if q["item"] is None else after - q["item"])
            assert q["bucket"] == bucket_label(q["distance"])
            if q["category"] in ("current", "method"):
                value = ledger.value_at(q["name"], after)
                assert q["answer"] == str(value if q["kind"] == "current" else value * 5 + 13)
            if q["category"] == "old":
                assert q["answer"] == str(ledger.value_at(q["name"], q["item"]))
                assert ledger.value_at(q["name"], after) != ledger.value_at(q["name"], q["item"])
            if q["category"] == "who":
                assert q["answer"] == ledger.first_actor(q["name"], q["item"])
            if q["category"] == "rule":
                assert q["name"] in ledger.rules.confidential and q["answer"] == "protected"


def test_questions_spread_over_the_distance_buckets_that_fit(hard_stream):
    folder, _ = hard_stream
    buckets = {
        q["bucket"] for r in read_stream(folder) if r["type"] == "questions" for q in r["questions"]
    }
    assert {"1–4", "5–24", "25–99", "100–399"} <= buckets  # ~200 batches: 400+ does not fit


def test_the_rules_families_state_their_rules_in_the_first_batch(hard_stream):
    folder, _ = hard_stream
    first = next(read_stream(folder))["text"]
    ledger = Ledger.load(folder)
    names = sorted(ledger.rules.confidential)
    assert len(names) == 3 and all(n in first for n in names)
    assert "House method: the tally of a counter is its value times five plus thirteen." in first
    assert (
        "Standing rule: any figure below zero, whether recorded or worked out, is reported as the single word overdrawn."
        in first
    )


def test_the_overdrawn_family_asks_about_values_and_tallies_below_zero(hard_stream):
    folder, _ = hard_stream
    ledger = Ledger.load(folder)
    overdrawn = [
        q
        for r in read_stream(folder)
        if r["type"] == "questions"
        for q in r["questions"]
        if q["category"] == "overdrawn"
    ]
    assert {q["kind"] for q in overdrawn} == {"current", "old", "tally"}
    assert all(q["answer"] == "overdrawn" for q in overdrawn)
    assert any(v < 0 for v in ledger.current.values())


def test_the_categories_cover_every_question_type(hard_stream):
    _, info = hard_stream
    assert set(info.by_category) == {
        "current",
        "old",
        "who",
        "rule",
        "method",
        "overdrawn",
        "unknown",
    }


def test_the_harder_family_says_it_and_uses_held_amounts_in_about_a_third_of_changes(hard_stream):
    folder, _ = hard_stream
    ledger = Ledger.load(folder)
    text = "\n".join(r["text"] for r in read_stream(folder) if r["type"] == "batch")
    changes = sum(len(ledger.changes_in(i)) for i in range(1, ledger.last_item + 1))
    indirect = text.count("Next on the list was ") + text.count(" as much as ")
    assert 0.2 < indirect / changes < 0.45


def test_the_shared_reading_skill_reads_every_batch_as_the_ledger_records_it(hard_stream):
    folder, _ = hard_stream
    ledger = Ledger.load(folder)
    values: dict[str, int] = {}
    for record in read_stream(folder):
        if record["type"] != "batch":
            continue
        read = []
        for event in read_events(record["text"]):
            source = values.get(event.source) if event.source else None
            new = apply_change(values.get(event.name), event, source)
            assert new is not None
            values[event.name] = new
            read.append((event.name, event.kind, new, event.actor))
        recorded = [(c.name, c.kind, c.value, c.actor) for c in ledger.changes_in(record["item"])]
        assert read == recorded, f"item {record['item']}"
    assert read_rules(next(read_stream(folder))["text"]) == ledger.rules


def test_adversarial_decoys_lose_and_regain_the_same_amount_in_later_batches(hard_stream):
    folder, _ = hard_stream
    lost: dict[str, tuple[int, int]] = {}
    round_trips = 0
    for record in read_stream(folder):
        if record["type"] != "batch":
            continue
        for m in re.finditer(r"(\w+) lost (.+?) when ", record["text"]):
            lost[m.group(1)] = (record["item"], _number(m.group(2)))
        for m in re.finditer(r"(\w+) regained (.+?) thanks to ", record["text"]):
            item, amount = lost.pop(m.group(1))
            assert item < record["item"] and amount == _number(m.group(2))
            round_trips += 1
    assert round_trips >= 3


def test_a_240k_stream_has_lab_sized_batches(tmp_path):
    info = generate_stream(
        preset_spec("240k", seed=0, families=frozenset({"rules", "overdrawn"})), tmp_path
    )
    assert 150 <= info.batches <= 240
    assert 240_000 <= info.approx_tokens < 250_000
    history = history_tokens_by_item(tmp_path)
    assert history[info.batches] == info.approx_tokens
    spec = json.loads((tmp_path / "spec.json").read_text())
    assert spec["info"]["batches"] == info.batches


def test_the_ledger_reader_refuses_a_damaged_snapshot(tmp_path):
    generate_stream(StreamSpec(seed=1, target_tokens=30_000, filler_sentences=(2, 4)), tmp_path)
    lines = (tmp_path / "ledger.jsonl").read_text().splitlines()
    index = next(i for i, line in enumerate(lines) if '"snapshot"' in line)
    record = json.loads(lines[index])
    name = next(iter(record["values"]))
    record["values"][name] += 1
    lines[index] = json.dumps(record)
    (tmp_path / "ledger.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match="snapshot after item 100 disagrees"):
        Ledger.load(tmp_path)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"families": frozenset({"base", "nonsense"})}, "families must be"),
        ({"question_every": 0}, "question_every"),
        ({"filler_sentences": (5, 2)}, "filler_sentences"),
        ({"target_tokens": 5}, "target_tokens"),
    ],
)
def test_a_bad_spec_says_what_to_fix(changes, message):
    with pytest.raises(ValueError, match=message):
        StreamSpec(**{"seed": 0, "target_tokens": 1_000, **changes})


def test_an_unknown_size_names_the_sizes():
    with pytest.raises(ValueError, match="tiny, small, 240k"):
        preset_spec("huge")
