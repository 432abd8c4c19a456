"""The notes audit: every saved NOTES version compared with the ledger at the point it covers.

A perfect score does not show that the notes are right: a wrong value costs no answer if nobody
asks for that counter before it is set again. The audit finds those. A version "covering items
A–B" is checked against the ledger at the end of item B; a value it gets wrong stays wrong while
that version is the notes, i.e. for the batches from B up to the next version's B (the last
version: up to the end of the stream), so a wrong line persisting across versions adds up.

The rendered notes are read with a few lines of regex (the format is pinned in docs/formats.md
§1), so the audit depends only on the text, never on the keeper's own parser.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from keeper_middleware.bench.ledger import Ledger
from keeper_middleware.bench.phrasing import NAME_RE
from keeper_middleware.numbers import parse_number

_COVERS = re.compile(r"Covers items (\d+)\s*[–-]\s*(\d+)")
_STATE_LINE = re.compile(r"^- (.+?) = (.*)$")


@dataclass(frozen=True, slots=True)
class NotesVersion:
    version: int
    first_item: int | None
    last_item: int | None
    text: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NotesVersion:
        return cls(
            version=int(data["version"]),
            first_item=data.get("first_item"),
            last_item=data.get("last_item"),
            text=str(data["text"]),
        )


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

    @property
    def counters_ever_wrong(self) -> list[str]:
        return sorted(self.wrong_batches)

    @property
    def wrong_per_1000_lines(self) -> float:
        return 1000 * len(self.wrong_lines) / self.total_lines if self.total_lines else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
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
        lines = [
            f"### Notes audit ({reader})",
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


def audit_notes(versions: Iterable[NotesVersion], ledger: Ledger) -> AuditResult:
    """Compare every counter line of every version with the ledger at the item it covers.

    Versions are read one at a time in the order given (the order they were saved, in which the
    items they cover never go down), holding only the one whose span is not known yet: a long
    run's versions add up to gigabytes. A version that covers fewer items than the one before
    is an error that names it.
    """
    wrong: list[WrongLine] = []
    wrong_batches: dict[str, int] = {}
    stretches: dict[str, list[tuple[int, int]]] = {}
    totals = [0, 0, 0]  # versions audited, counter lines, missing lines
    held: tuple[int, int, list[tuple[str, str]]] | None = None

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
        covered = covered_range(version)
        if covered is None:
            continue  # "Covers no items yet": nothing to be wrong about
        if held is not None:
            if covered[1] < held[1]:
                raise ValueError(
                    f"NOTES version {version.version} covers up to item {covered[1]}, before "
                    f"version {held[0]} (item {held[1]}): give the versions in the order saved"
                )
            settle(covered[1])
        held = (version.version, covered[1], read_state_lines(version.text))
    if held is not None:
        settle(max(ledger.last_item + 1, held[1] + 1))
    return AuditResult(
        versions_audited=totals[0],
        total_lines=totals[1],
        wrong_lines=tuple(wrong),
        wrong_batches=dict(sorted(wrong_batches.items())),
        wrong_stretches=dict(sorted(stretches.items())),
        missing_lines=totals[2],
    )
