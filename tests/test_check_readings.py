"""The checks' quicker readings find exactly what the plain readings find.

A cut's checks read the noted turns for amounts, signs and directions; the readings were made
cheaper (one pass over the sentences for the sign check, the number-word scan skipping words that
cannot start a number, short texts read once, names looked at before amounts). Each is pinned
here against the plain reading it replaced, over generated streams of several seeds and over
random text built to hit the edges (case variants, line breaks, "minus", number words run
together), and a whole run's NOTES and re-asks are the same with the plain readings swapped in.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from pathlib import Path

import pytest

import keeper_middleware.notes.checks.amounts as amounts_module
import keeper_middleware.notes.checks.keys as keys_module
import keeper_middleware.notes.checks.names as names_module
import keeper_middleware.notes.signs as signs_module
from keeper_bench.run_options import RunOptions, resolve_stream
from keeper_bench.runner import run_arm
from keeper_bench.streams import generate_stream, preset_spec, read_stream
from keeper_middleware.notes.block import Notes
from keeper_middleware.notes.changes import Change, RuleLine, SetLine, UnsetLine
from keeper_middleware.notes.checks.base import CheckContext, Issue
from keeper_middleware.notes.checks.names import TrackedNamesAccounted
from keeper_middleware.notes.numbers import (
    _DIGITS,
    _WORD_RUN,
    FIRST_LETTERS,
    amounts_in,
    parse_number,
    words_to_int,
)
from keeper_middleware.notes.signs import (
    _SIGNED_WORDS,
    amount_directions,
    sentence_direction,
    sentences,
    signed_amounts_in,
    value_statements,
)

SEEDS = (0, 5, 9)
NAMES = re.compile(r"\b[a-z]{4}\d{2}\b")

# -- the plain readings, as first written ----------------------------------------------------

_SKIP = f"(?=[{FIRST_LETTERS}])"
_PLAIN_WORDS = re.compile(_WORD_RUN.pattern.replace(_SKIP, ""), re.IGNORECASE)
_PLAIN_SIGNED_WORDS = re.compile(_SIGNED_WORDS.pattern.replace(_SKIP, ""), re.IGNORECASE)


def plain_amounts(text: str) -> set[float]:
    found = {abs(v) for m in _DIGITS.finditer(text) if (v := parse_number(m.group())) is not None}
    for match in _PLAIN_WORDS.finditer(text):
        value = words_to_int(match.group())
        if value is not None:
            found.add(float(abs(value)))
    return found


def plain_signed_amounts(text: str) -> frozenset[float]:
    found: set[float] = set()
    for match in _DIGITS.finditer(text):
        value = parse_number(match.group())
        if value is not None:
            minus = signs_module._minus_before(text, match.start())
            found.add(-abs(value) if minus else value)
    for match in _PLAIN_SIGNED_WORDS.finditer(text):
        value = words_to_int(match.group())
        if value is not None:
            found.add(float(value))
    return frozenset(found)


def plain_value_statements(text: str) -> frozenset[float]:
    found: set[float] = set()
    for sentence in sentences(text):
        if sentence_direction(sentence) in ("set", None):
            found |= plain_signed_amounts(sentence)
    return frozenset(found)


def plain_amount_directions(text: str) -> dict[float, frozenset[str]]:
    directions: dict[float, set[str]] = {}
    for sentence in sentences(text):
        direction = sentence_direction(sentence) or "none"
        for amount in plain_signed_amounts(sentence):
            directions.setdefault(abs(amount), set()).add(direction)
    return {amount: frozenset(found) for amount, found in directions.items()}


def plain_missing_names(
    changes: Sequence[Change], context: CheckContext, pattern: re.Pattern[str] = NAMES
) -> list[Issue]:
    """TrackedNamesAccounted as first written: every sentence read for amounts first."""
    accounted: set[str] = set()
    for change in changes:
        if isinstance(change, SetLine | UnsetLine):
            accounted |= {m.group().casefold() for m in pattern.finditer(change.key)}
        elif isinstance(change, RuleLine):
            accounted |= {m.group().casefold() for m in pattern.finditer(change.text)}
    missing: dict[str, None] = {}
    for sentence in re.split(r"(?<=[.!?])\s+|\n+", context.noted_text):
        sentence = sentence.strip()
        if not sentence or sentence.endswith("?") or not plain_amounts(sentence):
            continue
        for match in pattern.finditer(sentence):
            folded = match.group().casefold()
            if folded not in accounted and folded not in context.archived_keys:
                missing[match.group()] = None
    if not missing:
        return []
    names = ", ".join(missing)
    reason = (
        f"the turns state amounts for {names}, and no SET or UNSET line accounts for "
        f"{'it' if len(missing) == 1 else 'them'}"
    )
    return [Issue("", reason, "tracked_names_accounted", "reask")]


# -- texts ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def batches(tmp_path_factory) -> list[str]:
    texts: list[str] = []
    for seed in SEEDS:
        folder = tmp_path_factory.mktemp(f"stream{seed}")
        families = frozenset({"base", "harder", "rules", "overdrawn", "varied"})
        generate_stream(preset_spec("tiny", seed=seed, families=families), folder)
        texts += [r["text"] for r in read_stream(folder) if r.get("type") == "batch"]
    return texts


PIECES = (
    "minus ",
    "Negative ",
    "MINUS",
    "one",
    "One",
    "ONE",
    "twenty-one",
    "hundred and ",
    "and",
    "Seven",
    "seventy",
    "sevens",
    "zero",
    "thousand",
    "Billion",
    " ",
    "\n",
    "-",
    ". ",
    "; ",
    "? ",
    "took ",
    "added ",
    "recorded ",
    "set to ",
    "5",
    "-12",
    "1,204",
    "3.5",
    "x",
    "the ",
    "\u212a",
    "\u017f",
    "\u0130",
    "\u0131",
    "ſix",
    "ſeven",
    "tWo",
    "ninetY",
    "é",
    "中文",
    "domo86 ",
)
"""Pieces random texts are made of: number words in every case (and the letters whose case
folds oddly: the Kelvin sign, long s, dotted and dotless i), signs, breaks and verbs."""


def random_texts(count: int, seed: int) -> list[str]:
    generator = random.Random(seed)
    return [
        "".join(generator.choice(PIECES) for _ in range(generator.randint(0, 30)))
        for _ in range(count)
    ]


# -- the readings -----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_the_number_word_scans_find_the_same_runs_as_the_plain_patterns(batches, seed):
    texts = [*batches, *random_texts(3_000, seed)]
    found = 0
    for text in texts:
        spans = [m.span() for m in _WORD_RUN.finditer(text)]
        assert spans == [m.span() for m in _PLAIN_WORDS.finditer(text)], text
        signed = [m.span() for m in _SIGNED_WORDS.finditer(text)]
        assert signed == [m.span() for m in _PLAIN_SIGNED_WORDS.finditer(text)], text
        found += len(spans)
    assert found > len(texts) // 2  # the texts do state number words


@pytest.mark.parametrize("seed", SEEDS)
def test_amounts_read_once_are_the_amounts_a_fresh_reading_finds(batches, seed):
    texts = [*random_texts(2_000, seed), *(t[:400] for t in batches), *batches]
    for _ in range(2):  # the second time from what was remembered
        for text in texts:
            assert amounts_in(text) == plain_amounts(text), text
            assert signed_amounts_in(text) == plain_signed_amounts(text), text


def test_a_remembered_reading_of_amounts_cannot_be_changed_by_its_caller():
    first = amounts_in("Ada took six and gave 4.")
    first.add(99.0)
    assert amounts_in("Ada took six and gave 4.") == {6.0, 4.0}


@pytest.mark.parametrize("seed", SEEDS)
def test_one_pass_over_the_sentences_gives_the_plain_values_and_directions(batches, seed):
    generator = random.Random(seed)
    joined = ["\n".join(generator.sample(batches, 8)) for _ in range(10)]
    for text in [*batches, *joined, *random_texts(1_000, seed)]:
        assert value_statements(text) == plain_value_statements(text), text
        assert amount_directions(text) == plain_amount_directions(text), text


@pytest.mark.parametrize("seed", SEEDS)
def test_names_looked_at_first_leave_out_the_same_names(batches, seed):
    generator = random.Random(seed)
    check = TrackedNamesAccounted(tracked_names=NAMES)
    raised = 0
    for text in batches:
        names = list(dict.fromkeys(NAMES.findall(text)))
        lines: list[Change] = [
            SetLine(key=name, value="1") for name in names if generator.random() < 0.7
        ]
        archived = frozenset(n for n in names if generator.random() < 0.1)
        context = CheckContext(
            noted_text=text, notes=Notes(), tracked_names=NAMES, archived_keys=archived
        )
        found = check.check(lines, context)
        assert found == plain_missing_names(lines, context)
        raised += bool(found)
    assert raised  # some replies did leave names out


# -- a whole run ------------------------------------------------------------------------------


def _run_records(folder: Path, seed: int) -> tuple[list[str], dict[str, int], str]:
    stream = resolve_stream("tiny:harder+rules+overdrawn", folder / "stream", seed=seed)
    result = run_arm(RunOptions.create(arm="notes", stream=stream, window=8192), folder / "run")
    notes = [
        json.loads(line)["text"]
        for line in (folder / "run" / "notes.jsonl").read_text().splitlines()
    ]
    counters = json.loads((folder / "run" / "keeper_counters.json").read_text())
    kept = {k: counters[k] for k in ("cuts", "note_reasks", "notes_tokens") if k in counters}
    return notes, kept, f"{result.grade.right}/{result.grade.asked}"


@pytest.mark.parametrize("seed", (1, 4))
def test_a_run_takes_the_same_notes_with_the_plain_readings(tmp_path, monkeypatch, seed):
    quick = _run_records(tmp_path / "quick", seed)
    monkeypatch.setattr(signs_module, "value_statements", plain_value_statements)
    monkeypatch.setattr(amounts_module, "value_statements", plain_value_statements)
    monkeypatch.setattr(amounts_module, "amount_directions", plain_amount_directions)
    monkeypatch.setattr(amounts_module, "signed_amounts_in", plain_signed_amounts)
    monkeypatch.setattr(amounts_module, "amounts_in", plain_amounts)
    monkeypatch.setattr(names_module, "amounts_in", plain_amounts)
    monkeypatch.setattr(keys_module, "amounts_in", plain_amounts)
    monkeypatch.setattr(TrackedNamesAccounted, "check", _plain_accounted_check)
    plain = _run_records(tmp_path / "plain", seed)
    assert len(quick[0]) >= 2
    assert quick == plain


def _plain_accounted_check(
    self: TrackedNamesAccounted, changes: Sequence[Change], context: CheckContext
) -> list[Issue]:
    pattern = self.tracked_names or context.tracked_names
    return [] if pattern is None else plain_missing_names(changes, context, pattern)
