"""The generator: deterministic, true to the pinned wording, and its ledger re-derivable from the text.

The ledger check uses a second, independent parser written here (plain string handling and its
own number words), so a bug in phrasing.py cannot hide a matching bug in the ledger.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from pathlib import Path

import pytest

from keeper_bench import reader as reader_package
from keeper_bench.ledger import Ledger
from keeper_bench.phrasing import apply_change
from keeper_bench.questions import bucket_label
from keeper_bench.reader.text import read_rules, read_story
from keeper_bench.story import check_vocabulary
from keeper_bench.streams import (
    StreamSpec,
    generate_stream,
    history_tokens_by_item,
    preset_spec,
    read_stream,
)

ALL = frozenset({"base", "rules", "overdrawn", "harder", "adversarial", "varied"})

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


_LEADS = ("Next on the list was ", "Attention turned to ", "Then came ")
_PASSIVE = (  # "X was set to A by B": (marker, kind)
    (" was set to ", "set"),
    (" was recorded at ", "set"),
    (" was credited with ", "add"),
    (" was debited ", "take"),
)
_ACTIVE = (  # "B verb ... ": (marker, kind, amount first?, separator)
    (" recorded ", "set", False, " at "),
    (" logged ", "set", False, " at "),
    (" brought ", "set", False, " to "),
    (" raised ", "add", False, " by "),
    (" lowered ", "take", False, " by "),
    (" added ", "add", True, " to "),
    (" put ", "add", True, " more into "),
    (" took ", "take", True, " from "),
    (" removed ", "take", True, " from "),
)


def _change(s: str, antecedent: str) -> list | None:
    """[kind, target, amount text, actor] for one sentence (no trailing period); None if none."""
    if s.startswith("It was set to "):
        amount, actor = s.removeprefix("It was set to ").split(" by ")
        return ["set", antecedent, amount, actor]
    if s.startswith("The clerk recorded "):
        target, amount = s.removeprefix("The clerk recorded ").split(" at ")
        return ["set", target, amount, "the clerk"]
    for marker, kind in _PASSIVE:
        if marker in s:
            target, rest = s.split(marker)
            amount, actor = rest.split(" by ")
            return [kind, target, amount, actor]
    if " were added to " in s or " were taken from " in s:
        kind = "add" if " were added to " in s else "take"
        amount, rest = s.split(" were added to " if kind == "add" else " were taken from ")
        target, actor = rest.split(" by ")
        return [kind, target, amount, actor]
    if " lost " in s:
        target, rest = s.split(" lost ")
        amount, rest = rest.split(" when ")
        return ["take", target, amount, rest.removesuffix(" dropped a crate")]
    if " regained " in s:
        target, rest = s.split(" regained ")
        amount, actor = rest.split(" thanks to ")
        return ["add", target, amount, actor]
    for marker, kind, amount_first, separator in _ACTIVE:
        if marker in s:
            actor, _, rest = s.partition(marker)
            first, second = rest.split(separator)
            amount, target = (first, second) if amount_first else (second, first)
            return [kind, antecedent if target == "it" else target, amount, actor]
    return None


def _derive(text: str, values: dict[str, int], carry: dict) -> list[tuple[str, int, str]]:
    """Apply one batch's sentences to ``values``; return (name, value after, actor) per change.
    ``carry`` holds a recount begun in the previous batch."""
    changes: list[list] = []
    antecedent = ""
    for sentence in _sentences(text):
        s = sentence[:-1]
        if s.startswith("Standing rule") or s.startswith("House method"):
            continue
        if s.startswith("Correction: that should have read "):
            changes[-1][2] = s.removeprefix("Correction: that should have read ")
            continue
        if s.startswith("The recount begun in the previous item came to "):
            target, actor = carry.pop("recount")
            changes.append(["set", target, s.rsplit(" came to ", 1)[1], actor])
            continue
        if " began a recount of " in s:
            actor, target = s.split(" began a recount of ")
            carry["recount"] = (target, actor)
            continue
        lead = next((p for p in _LEADS if s.startswith(p)), None)
        if lead is not None:
            antecedent = s.removeprefix(lead)
            continue
        named = any(re.fullmatch(r"[a-z]+\d\d", w) for w in s.replace(",", "").split())
        if not named and not re.search(r"\bit\b|^It ", s):
            continue
        if " as much as " in s:  # "{Actor} added to X as much as Y held"
            head, _, rest = s.partition(" as much as ")
            sign = 1 if " added to " in head else -1
            actor, target = head.split(" added to " if sign == 1 else " took from ")
            changes.append(["held", target, rest.removesuffix(" held"), actor, sign])
            continue
        change = _change(s, antecedent)
        if change is None:
            raise AssertionError(f"a sentence with a counter name matches no template: {s!r}")
        changes.append(change)
    done: list[tuple[str, int, str]] = []
    for kind, target, amount, actor, *sign in changes:
        if kind == "held":
            values[target] += sign[0] * values[amount]
        else:
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
    carry: dict = {}
    for record in read_stream(folder):
        if record["type"] != "batch":
            continue
        item = record["item"]
        derived = _derive(record["text"], values, carry)
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
        "before_last",
        "count",
        "order",
        "gist",
        "rule",
        "method",
        "overdrawn",
        "unknown",
    }


def test_the_harder_family_says_it_and_uses_held_amounts_in_about_a_third_of_changes(tmp_path):
    folder = tmp_path
    spec = StreamSpec(
        seed=3, target_tokens=60_000, families=ALL - {"varied"}, filler_sentences=(10, 20)
    )
    generate_stream(spec, folder)
    ledger = Ledger.load(folder)
    text = "\n".join(r["text"] for r in read_stream(folder) if r["type"] == "batch")
    changes = sum(len(ledger.changes_in(i)) for i in range(1, ledger.last_item + 1))
    indirect = text.count("Next on the list was ") + text.count(" as much as ")
    assert 0.2 < indirect / changes < 0.45


def _read_as_the_reader_does(folder) -> None:
    ledger = Ledger.load(folder)
    batches = [record for record in read_stream(folder) if record["type"] == "batch"]
    found, _ = read_story([record["text"] for record in batches])
    values: dict[str, int] = {}
    for record, events in zip(batches, found, strict=True):
        read = []
        for event in events:
            source = values.get(event.source) if event.source else None
            new = apply_change(values.get(event.name), event, source)  # type: ignore[arg-type]
            assert new is not None
            values[event.name] = new
            read.append((event.name, event.kind, new, event.actor))
        recorded = [(c.name, c.kind, c.value, c.actor) for c in ledger.changes_in(record["item"])]
        assert read == recorded, f"item {record['item']}"
    rules = read_rules(batches[0]["text"])
    expected = ledger.rules
    assert (rules.confidential, rules.tally, rules.overdrawn) == (
        expected.confidential,
        expected.tally,
        expected.overdrawn,
    )


def test_the_readers_parser_reads_every_batch_as_the_ledger_records_it(hard_stream):
    _read_as_the_reader_does(hard_stream[0])


@pytest.mark.parametrize("size", ["tiny", "small"])
@pytest.mark.parametrize("families", ["rules+varied", "overdrawn+harder+varied"])
@pytest.mark.parametrize("seed", [1, 2, 5])
def test_the_readers_parser_reads_varied_text_as_the_ledger_across_seeds_and_sizes(
    tmp_path, seed, families, size
):
    chosen = frozenset({"base", *families.split("+")})
    generate_stream(preset_spec(size, seed=seed, families=chosen), tmp_path)
    text = "\n".join(r["text"] for r in read_stream(tmp_path) if r["type"] == "batch")
    assert "Correction: " in text or size == "tiny"
    _read_as_the_reader_does(tmp_path)


def test_the_varied_family_uses_every_kind_of_phrasing(tmp_path):
    generate_stream(preset_spec("small", seed=4, families=frozenset({"varied"})), tmp_path)
    text = "\n".join(r["text"] for r in read_stream(tmp_path) if r["type"] == "batch")
    for marker in (
        "Correction: that should have read",
        "began a recount of",
        "The recount begun in the previous item came to",
        " was credited with ",
        " was debited ",
        " more into it.",
        "It was set to ",
    ):
        assert marker in text, marker
    assert re.search(r"(?:Attention turned to|Then came|Next on the list was) [a-z]+\d\d\.", text)


def test_no_module_of_the_reader_imports_the_generator():
    """The reader's parser is written from docs/stream-text.md, never from the templates."""
    generator = {"phrasing", "story", "streams", "questions", "ledger"}
    folder = Path(reader_package.__file__).parent
    for module in folder.glob("*.py"):
        tree = ast.parse(module.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                parts = name.split(".")
                assert not (
                    parts[0] == "keeper_bench" and len(parts) > 1 and parts[1] in generator
                ), f"{module.name} imports {name}"


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


def test_the_new_question_kinds_are_answered_by_an_independent_reading_of_the_text(hard_stream):
    """The value before the last change, a count, an order and a gist, each re-derived from the
    text (the test's own parser) rather than the ledger."""
    folder, _ = hard_stream
    values: dict[str, int] = {}
    carry: dict = {}
    history: dict[str, list[tuple[int, int]]] = {}  # name -> [(item, value after), ...]
    seen_kinds: set[str] = set()
    for record in read_stream(folder):
        if record["type"] == "batch":
            for name, value, _ in _derive(record["text"], values, carry):
                history.setdefault(name, []).append((record["item"], value))
            continue
        for q in record["questions"]:
            name, kind = q["name"], q["kind"]
            if kind not in ("before_last", "count", "order", "gist"):
                continue
            seen_kinds.add(kind)
            assert q["category"] == kind
            if kind == "before_last":
                assert q["answer"] == str(history[name][-2][1])
                assert q["item"] == history[name][-1][0]
            elif kind == "count":
                span = range(q["item"], q["until"] + 1)
                assert q["answer"] == str(sum(1 for item, _ in history[name] if item in span))
            elif kind == "order":
                (other,) = q["others"]
                first = min((name, other), key=lambda n: history[n][0][0])
                assert q["answer"] == first and history[name][0][0] != history[other][0][0]
            else:
                span = range(q["item"], q["until"] + 1)
                counts = {
                    n: sum(1 for item, _ in history[n] if item in span)
                    for n in (name, *q["others"])
                }
                best = max(counts.values())
                assert [n for n, c in counts.items() if c == best] == [q["answer"]]
    assert seen_kinds == {"before_last", "count", "order", "gist"}
