"""The memory audit: every saved version of what an arm keeps, compared with the ledger.

A perfect score does not show that a memory is right: a wrong value costs no answer if nobody
asks for that counter before it is set again. The audit finds those, in every memory an arm
keeps: the keeper's NOTES and the summaries of the summarising arms and peers, counted the same
way. A version covering items up to B is checked against the ledger at the end of item B; a value
it gets wrong (a misread, or a stale value a change never reached) stays wrong while that version
is the memory, i.e. for the batches from B up to the next version's B (the last version: up to
the end of the stream), so a wrong line persisting across versions adds up. A counter the stream
had set that a version does not state at all is a missing line, not a wrong one.

The rendered notes are read with a few lines of regex (the format is pinned in docs/formats.md
§1), so the audit depends only on the text, never on the keeper's own parser. A summary is free
text, read the way its reader would take it (see :func:`summary_claims`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from keeper_bench.ledger import Ledger
from keeper_bench.phrasing import NAME_RE
from keeper_middleware.notes.numbers import format_number, parse_number
from keeper_middleware.notes.signs import first_amount, sentence_direction, sentences

_COVERS = re.compile(r"Covers items (\d+)\s*[–-]\s*(\d+)")
_STATE_LINE = re.compile(r"^- (.+?) = (.*)$")
MemoryKind = Literal["notes", "summary", "pinned"]
MEMORY_FILES: dict[MemoryKind, str] = {
    "notes": "notes.jsonl",
    "summary": "summaries.jsonl",
    "pinned": "pinned.jsonl",
}
"""The run folder's file of saved versions, per kind of memory ("pinned": the state a
self-editing model keeps for itself, saved each time turns leave its window)."""
_LABEL: dict[MemoryKind, str] = {"notes": "NOTES", "summary": "Summary", "pinned": "Pinned state"}


@dataclass(frozen=True, slots=True)
class MemoryVersion:
    """One saved version of an arm's memory: a NOTES block or a summary."""

    version: int
    first_item: int | None
    last_item: int | None
    text: str
    kind: MemoryKind = "notes"

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MemoryVersion:
        kind = str(data.get("kind", "notes"))
        if kind not in MEMORY_FILES:
            raise ValueError(f"memory kind {kind!r}: use one of {', '.join(MEMORY_FILES)}")
        return cls(
            version=int(data["version"]),
            first_item=data.get("first_item"),
            last_item=data.get("last_item"),
            text=str(data["text"]),
            kind=kind,  # type: ignore[arg-type]
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "first_item": self.first_item,
            "last_item": self.last_item,
            "text": self.text,
            "kind": self.kind,
        }


NotesVersion = MemoryVersion
"""The name the audit had when it read NOTES only."""


def read_state_lines(text: str) -> list[tuple[str, str]]:
    """The ``- key = value`` lines of the STATE section, in order."""
    lines: list[tuple[str, str]] = []
    section = ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if line in ("RULES", "STATE", "OPEN"):
            section = line
            continue
        if section == "STATE":
            match = _STATE_LINE.match(line)
            if match:
                lines.append((match.group(1).strip(), match.group(2).strip()))
    return lines


_HISTORY = re.compile(r"\b(?:item|batch)\s+\d+|\bbefore\b|\bearlier\b|\bprevious(?:ly)?\b", re.I)
_CURRENT = re.compile(r"\b(?:now|currently|current|latest|at present)\b", re.I)


def _claim_in(sentence: str, name: str) -> float | None:
    """The value a sentence states for ``name``: the first amount after the name (and before the
    next counter named), when the sentence sets or states a value ("recorded domo86 at 342",
    "domo86 = 332", "domo86 holds 332") rather than moving one ("took 10 from domo86")."""
    if sentence_direction(sentence) not in ("set", None):
        return None
    after = sentence[sentence.index(name) + len(name) :]
    return first_amount(NAME_RE.split(after, maxsplit=1)[0])


def summary_claims(text: str) -> list[tuple[str, str]]:
    """What a summary says each counter holds, the way a reader of it would take it.

    Per counter, the value of the last sentence that states one, where a sentence saying
    "now" or "currently" wins over one about history ("in item 37", "before"). Sentences that
    move a value ("ten were taken from domo86") state no value. One claim per counter.
    """
    current: dict[str, str] = {}
    history: dict[str, str] = {}
    for sentence in sentences(text):
        names = list(dict.fromkeys(NAME_RE.findall(sentence)))
        for name in names:
            value = _claim_in(sentence, name)
            if value is None:
                continue
            if _HISTORY.search(sentence) and not _CURRENT.search(sentence):
                history[name] = format_number(value)
            else:
                current[name] = format_number(value)
    return [(name, current.get(name) or history[name]) for name in {**history, **current}]


def claimed_values(version: MemoryVersion) -> list[tuple[str, str]]:
    """The (counter, value) lines a version states: STATE lines of NOTES, claims of a summary
    or of a pinned state (``name value`` lines and prose are read alike, as free text)."""
    if version.kind in ("summary", "pinned"):
        return summary_claims(version.text)
    return read_state_lines(version.text)


def covered_range(version: NotesVersion) -> tuple[int, int] | None:
    """(first, last) item a version covers: from its record, else from its header line."""
    if version.last_item is not None:
        return (version.first_item or 1, version.last_item)
    match = _COVERS.search(version.text)
    return (int(match.group(1)), int(match.group(2))) if match else None


@dataclass(frozen=True, slots=True)
class WrongLine:
    version: int
    last_item: int
    name: str
    noted: str
    true: int | None
    """None: the stream had not set this counter by ``last_item``."""


@dataclass(frozen=True, slots=True)
class AuditResult:
    versions_audited: int
    total_lines: int
    """Counter lines checked, over all versions."""
    wrong_lines: tuple[WrongLine, ...]
    wrong_batches: dict[str, int] = field(default_factory=dict)
    """Per counter ever wrong: for how many batches a wrong value was in the notes."""
    wrong_stretches: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    """Per counter: (from_item, to_item) stretches during which its noted value was wrong."""
    missing_lines: int = 0
    """Counters the stream had set but a version did not note, summed over versions."""
    memory: str = "notes"
    """What was audited: "notes", "summary", or "none" for an arm that keeps no memory."""

    @property
    def counters_ever_wrong(self) -> list[str]:
        return sorted(self.wrong_batches)

    @property
    def wrong_per_1000_lines(self) -> float:
        return 1000 * len(self.wrong_lines) / self.total_lines if self.total_lines else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "memory": self.memory,
            "versions_audited": self.versions_audited,
            "total_lines": self.total_lines,
            "counters_ever_wrong": self.counters_ever_wrong,
            "wrong_batches": self.wrong_batches,
            "wrong_stretches": {k: [list(s) for s in v] for k, v in self.wrong_stretches.items()},
            "silent_wrong_per_1000_lines": round(self.wrong_per_1000_lines, 3),
            "missing_lines": self.missing_lines,
            "wrong_lines": [
                {
                    "version": w.version,
                    "last_item": w.last_item,
                    "name": w.name,
                    "noted": w.noted,
                    "true": w.true,
                }
                for w in self.wrong_lines
            ],
        }

    def markdown(self, reader: str) -> str:
        title = {
            "notes": "Notes audit",
            "summary": "Summary audit",
            "pinned": "Pinned state audit",
        }.get(self.memory, "Audit")
        lines = [
            f"### {title} ({reader})",
            "",
            "| versions audited | counter lines | wrong lines | per 1,000 lines | counters ever wrong | missing lines |",
            "| --- | --- | --- | --- | --- | --- |",
            f"| {self.versions_audited} | {self.total_lines} | {len(self.wrong_lines)} | "
            f"{self.wrong_per_1000_lines:.2f} | {len(self.wrong_batches)} | {self.missing_lines} |",
        ]
        if self.wrong_batches:
            lines += ["", "| counter | batches wrong | stretches |", "| --- | --- | --- |"]
            for name in self.counters_ever_wrong:
                stretches = ", ".join(f"{a}–{b}" for a, b in self.wrong_stretches[name])
                lines.append(f"| {name} | {self.wrong_batches[name]} | {stretches} |")
        return "\n".join(lines) + "\n"


def _is_right(noted: str, true: int | None) -> bool:
    if true is None:
        return False
    value = parse_number(noted)
    return value is not None and value == true


def audit_notes(versions: Iterable[MemoryVersion], ledger: Ledger) -> AuditResult:
    """Compare every counter line of every version with the ledger at the item it covers.

    NOTES and summaries are audited alike (see :func:`claimed_values`); the versions must be of
    one kind (one memory). Versions are read one at a time in the order given (the order they
    were saved, in which the items they cover never go down), holding only the one whose span
    is not known yet: a long run's versions add up to gigabytes. A version that covers fewer
    items than the one before, or is of another kind, is an error that names it.
    """
    wrong: list[WrongLine] = []
    wrong_batches: dict[str, int] = {}
    stretches: dict[str, list[tuple[int, int]]] = {}
    totals = [0, 0, 0]  # versions audited, counter lines, missing lines
    held: tuple[int, int, list[tuple[str, str]]] | None = None
    kind: str | None = None

    def settle(until: int) -> None:
        assert held is not None
        number, last_item, state = held
        span = max(1, until - last_item)
        noted_names: set[str] = set()
        totals[0] += 1
        for key, noted in state:
            if not NAME_RE.fullmatch(key):
                continue
            noted_names.add(key)
            totals[1] += 1
            true = ledger.value_at(key, last_item)
            if _is_right(noted, true):
                continue
            wrong.append(WrongLine(number, last_item, key, noted, true))
            wrong_batches[key] = wrong_batches.get(key, 0) + span
            runs = stretches.setdefault(key, [])
            if runs and runs[-1][1] == last_item - 1:
                runs[-1] = (runs[-1][0], last_item + span - 1)
            else:
                runs.append((last_item, last_item + span - 1))
        totals[2] += sum(
            1
            for name in ledger.names()
            if name not in noted_names and ledger.value_at(name, last_item) is not None
        )

    for version in versions:
        kind = version.kind if kind is None else kind
        if version.kind != kind:
            raise ValueError(
                f"{version.kind} version {version.version} among {kind} versions: "
                "audit one memory at a time"
            )
        covered = covered_range(version)
        if covered is None:
            continue  # "Covers no items yet": nothing to be wrong about
        if held is not None:
            if covered[1] < held[1]:
                raise ValueError(
                    f"{_LABEL[version.kind]} version {version.version} covers up to item "
                    f"{covered[1]}, before version {held[0]} (item {held[1]}): give the "
                    "versions in the order saved"
                )
            settle(covered[1])
        held = (version.version, covered[1], claimed_values(version))
    if held is not None:
        settle(max(ledger.last_item + 1, held[1] + 1))
    return AuditResult(
        versions_audited=totals[0],
        total_lines=totals[1],
        wrong_lines=tuple(wrong),
        wrong_batches=dict(sorted(wrong_batches.items())),
        wrong_stretches=dict(sorted(stretches.items())),
        missing_lines=totals[2],
        memory=kind or "none",
    )


audit_memory = audit_notes
