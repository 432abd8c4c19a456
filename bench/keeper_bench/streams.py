"""The deterministic stream generator: batches of short stories about counters, with questions.

``generate_stream(spec, folder)`` writes, one record per line, never holding more than one batch
of text in memory (only the ledger's numbers are kept: a few per change, ~5 MB at 10M tokens):

- ``stream.jsonl``: ``{"type": "batch", "item": N, "text": ...}`` and ``{"type": "questions",
  "after_item": N, "final": bool, "text": ..., "questions": [{"number", "kind", "name", "item",
  "answer", "category", "distance", "bucket"}, ...]}`` in the order a reader meets them;
- ``ledger.jsonl``: the truth (see ``ledger.py``);
- ``spec.json``: the spec and the counts.

The same spec always gives the same bytes. The wording is pinned in docs/stream-text.md and lives
in ``phrasing.py``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from keeper_bench.ledger import (
    LEDGER_FILE,
    SNAPSHOT_EVERY,
    Ledger,
    LedgerChange,
    batch_record,
    rules_record,
    snapshot_record,
)
from keeper_bench.phrasing import (
    RulesInForce,
    render_batch_head,
    render_questions_message,
    render_rules,
)
from keeper_bench.questions import QuestionPicker, QuestionRecord
from keeper_bench.story import ChangeWriter, FillerWriter, NameMaker

FAMILIES = frozenset(
    {"base", "rules", "overdrawn", "harder", "adversarial", "varied", "entry_heads"}
)
"""What a stream holds; ``entry_heads`` changes only the batch heads ("Entry N." for "Item N.",
which the product's default item pattern does not match): the same story, changes and
questions."""
STREAM_FILE = "stream.jsonl"
SPEC_FILE = "spec.json"
TALLY = (5, 13)


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamSpec:
    seed: int
    target_tokens: int
    """Stop after the batch that brings the stream (batches and questions) to this many tokens (chars/4)."""
    families: frozenset[str] = frozenset({"base"})
    question_every: int = 25
    changes_per_batch: int = 3
    filler_sentences: tuple[int, int] = (80, 120)
    """Filler sentences per batch (inclusive range): the default makes ~1,000–1,600-token batches."""
    final_questions: int = 14
    questions_per_set: int = 3
    """Current/old/who questions per set; rule, method, overdrawn and unknown questions come on top."""
    history_questions: bool = True
    """One question of each kind that needs a counter's history (the value before its last
    change, a count, an order, a gist) at the end of every set."""

    def __post_init__(self) -> None:
        unknown = set(self.families) - FAMILIES
        if unknown or not self.families:
            raise ValueError(
                f"families must be a non-empty subset of {sorted(FAMILIES)}, got {sorted(self.families)}"
            )
        if self.target_tokens < 100:
            raise ValueError(f"target_tokens must be at least 100, got {self.target_tokens}")
        if self.question_every < 1:
            raise ValueError(f"question_every must be at least 1 batch, got {self.question_every}")
        if not 1 <= self.changes_per_batch <= 20:
            raise ValueError(f"changes_per_batch must be 1–20, got {self.changes_per_batch}")
        low, high = self.filler_sentences
        if not 0 <= low <= high:
            raise ValueError(
                f"filler_sentences must be a range (low, high) with 0 <= low <= high, got {self.filler_sentences}"
            )
        if self.final_questions < 0 or self.questions_per_set < 0:
            raise ValueError("final_questions and questions_per_set must not be negative")

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["families"] = sorted(self.families)
        data["filler_sentences"] = list(self.filler_sentences)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StreamSpec:
        return cls(
            **{
                "history_questions": False,  # a spec written before these questions existed
                **data,
                "families": frozenset(data["families"]),
                "filler_sentences": tuple(data["filler_sentences"]),
            }
        )


SIZES: dict[str, dict[str, Any]] = {
    "tiny": {
        "target_tokens": 5_000,
        "question_every": 5,
        "filler_sentences": (4, 8),
        "final_questions": 6,
        # a smoke size: at the 4K windows it is run with, eleven questions a set need more
        # searches than the keeper allows between inputs, so it asks the older kinds only
        "history_questions": False,
    },
    "small": {"target_tokens": 30_000, "question_every": 10, "filler_sentences": (10, 16)},
    "240k": {"target_tokens": 240_000},
    "1m": {"target_tokens": 1_000_000},
    "2m": {"target_tokens": 2_000_000},
    "10m": {"target_tokens": 10_000_000},
}


def preset_spec(
    size: str, *, seed: int = 0, families: frozenset[str] = frozenset({"base"})
) -> StreamSpec:
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    return StreamSpec(seed=seed, families=families, **SIZES[size])


@dataclass(frozen=True, slots=True)
class StreamInfo:
    folder: Path
    batches: int
    approx_tokens: int
    questions: int
    question_sets: int
    counters: int
    by_category: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "folder": str(self.folder)}


class _Writer:
    """Counts what it writes, so the generator knows when the target size is reached."""

    def __init__(self, handle: TextIO) -> None:
        self.handle = handle
        self.chars = 0

    def write(self, record: dict[str, Any], counted_text: str) -> None:
        self.handle.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
        self.chars += len(counted_text)


def generate_stream(spec: StreamSpec, folder: Path | str) -> StreamInfo:
    """Write a stream for ``spec`` into ``folder`` (created if needed; existing files replaced)."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(spec.seed)
    names = NameMaker(rng)
    has_rules = "rules" in spec.families
    has_overdrawn = "overdrawn" in spec.families
    confidential = tuple(names.new() for _ in range(3)) if has_rules else ()
    rules = RulesInForce(frozenset(confidential), TALLY if has_rules else None, has_overdrawn)
    never_used = tuple(names.new() for _ in range(8))
    ledger = Ledger(rules)
    picker = QuestionPicker(ledger, random.Random(spec.seed * 7919 + 1), never_used=never_used)
    changes = ChangeWriter(
        rng, names, ledger, families=spec.families, per_batch=spec.changes_per_batch
    )
    filler = FillerWriter(random.Random(spec.seed * 7919 + 2))
    by_category: dict[str, int] = {}
    question_count = sets = 0

    def emit_questions(
        stream: _Writer, after: int, records: list[QuestionRecord], final: bool
    ) -> None:
        nonlocal question_count, sets
        if not records:
            return
        text = render_questions_message(((q.number, q.text) for q in records), final=final)
        stream.write(
            {
                "type": "questions",
                "after_item": after,
                "final": final,
                "text": text,
                "questions": [q.to_json() for q in records],
            },
            text,
        )
        question_count += len(records)
        sets += 1
        for q in records:
            by_category[q.category] = by_category.get(q.category, 0) + 1

    with (
        (out / STREAM_FILE).open("w", encoding="utf-8") as stream_handle,
        (out / LEDGER_FILE).open("w", encoding="utf-8") as ledger_handle,
    ):
        stream = _Writer(stream_handle)
        ledger_handle.write(json.dumps(rules_record(rules)) + "\n")
        item = 0
        while item == 0 or stream.chars // 4 < spec.target_tokens:
            item += 1
            opening = (
                render_rules(confidential=confidential, tally=rules.tally, overdrawn=has_overdrawn)
                if item == 1
                else []
            )
            units, applied = changes.batch(item, first=confidential if item == 1 else ())
            text = _batch_text(item, opening, units, filler, rng, spec.filler_sentences)
            if "entry_heads" in spec.families:
                text = text.replace(
                    render_batch_head(item), render_batch_head(item, word="Entry"), 1
                )
            text = _with_carried(text, changes.carried_in, changes.carried_out)
            ledger.record(item, applied)
            picker.note_batch(item)
            _write_ledger(ledger_handle, item, applied, ledger)
            stream.write({"type": "batch", "item": item, "text": text}, text)
            if item % spec.question_every == 0 and stream.chars // 4 < spec.target_tokens:
                records = picker.question_set(
                    item,
                    sets,
                    base=spec.questions_per_set,
                    rules=has_rules,
                    overdrawn=has_overdrawn,
                    history=spec.history_questions,
                )
                emit_questions(stream, item, records, final=False)
        emit_questions(stream, item, picker.final_questions(item, spec.final_questions), final=True)
    info = StreamInfo(
        out,
        item,
        stream.chars // 4,
        question_count,
        sets,
        len(ledger.current),
        dict(sorted(by_category.items())),
    )
    spec_data = {
        "spec": spec.to_json(),
        "info": {k: v for k, v in info.to_json().items() if k != "folder"},
        "never_used": list(never_used),
    }
    (out / SPEC_FILE).write_text(
        json.dumps(spec_data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    return info


def _write_ledger(handle: TextIO, item: int, applied: list[LedgerChange], ledger: Ledger) -> None:
    handle.write(json.dumps(batch_record(item, applied), separators=(",", ":")) + "\n")
    if item % SNAPSHOT_EVERY == 0:
        handle.write(
            json.dumps(snapshot_record(item, ledger.current), separators=(",", ":")) + "\n"
        )


def _batch_text(
    item: int,
    opening: list[str],
    units: list[str],
    filler: FillerWriter,
    rng: random.Random,
    sentences: tuple[int, int],
) -> str:
    """``Item N.`` then the story: change units placed at random among the filler sentences."""
    story = [filler.sentence() for _ in range(rng.randint(*sentences))]
    slots = sorted(rng.randint(0, len(story)) for _ in units)
    for offset, (slot, unit) in enumerate(zip(slots, units, strict=True)):
        story.insert(slot + offset, unit)  # sorted slots keep the units in story order
    # each rule sentence stands between filler: a rule that names nothing must share no words
    # with the questions, and must not be shown as "the next sentence" of one that does
    opening = [part for rule in opening for part in (filler.sentence(), rule)]
    if opening:
        opening.append(filler.sentence())
    body = opening + story
    paragraphs = [" ".join(body[i : i + 8]) for i in range(0, len(body), 8)]
    return "\n".join([render_batch_head(item), *paragraphs])


def _with_carried(text: str, carried_in: str | None, carried_out: str | None) -> str:
    """A change told over two items: its end opens this story, its start closes it."""
    head, _, story = text.partition("\n")
    if carried_in is not None:
        story = f"{carried_in} {story}"
    if carried_out is not None:
        story = f"{story} {carried_out}"
    return f"{head}\n{story}"


def read_stream(folder: Path | str) -> Iterator[dict[str, Any]]:
    """The records of ``stream.jsonl`` in order, one at a time."""
    path = Path(folder) / STREAM_FILE
    if not path.exists():
        raise FileNotFoundError(f"no stream at {path}: generate one with keeper-bench generate")
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


def load_spec(folder: Path | str) -> StreamSpec:
    data = json.loads((Path(folder) / SPEC_FILE).read_text(encoding="utf-8"))
    return StreamSpec.from_json(data["spec"])


def history_tokens_by_item(folder: Path | str) -> dict[int, int]:
    """Item → tokens of stream text (batches and questions, chars/4) up to and including it."""
    history: dict[int, int] = {}
    chars = 0
    for record in read_stream(folder):
        chars += len(record["text"])
        item = int(record["item"] if record["type"] == "batch" else record["after_item"])
        history[item] = chars // 4
    return history


def question_sets(folder: Path | str) -> Iterator[dict[str, Any]]:
    """The stream's questions records, in order."""
    return (record for record in read_stream(folder) if record["type"] == "questions")
