"""The truth about a stream: every counter's value after every batch, and who changed what.

``ledger.jsonl`` holds one record per line, in item order:

- ``{"type": "rules", "confidential": [...], "tally": [5, 13] | null, "overdrawn": bool}``
  (first line; the rules the stream states in item 1, empty for a stream without rules);
- ``{"type": "batch", "item": N, "changes": [{"name", "kind", "amount", "source", "actor",
  "value"}, ...], "values": {name: value}}`` for every batch: its changes in story order (for a
  *_held change ``amount`` is the other counter's value at that moment, ``value`` the counter's
  value right after the change), and the value at the end of the batch of each counter it changed;
- ``{"type": "snapshot", "item": N, "values": {name: value}}`` after every 100th batch: every
  counter's value, so a reader can start part way in and a damaged file shows itself.

The file is small next to the stream (a few changes per ~1,300-token batch), so the reader keeps
a per-counter history in memory and answers ``value_at`` with a binary search.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keeper_bench.phrasing import EventKind, RulesInForce

SNAPSHOT_EVERY = 100
LEDGER_FILE = "ledger.jsonl"
_NO_RULES = RulesInForce()


@dataclass(frozen=True, slots=True)
class LedgerChange:
    """One change as it happened: the amount actually applied and the value it left."""

    name: str
    kind: EventKind
    amount: int
    source: str | None
    actor: str
    value: int

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "amount": self.amount,
            "source": self.source,
            "actor": self.actor,
            "value": self.value,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LedgerChange:
        return cls(
            name=str(data["name"]),
            kind=data["kind"],
            amount=int(data["amount"]),
            source=data.get("source"),
            actor=str(data["actor"]),
            value=int(data["value"]),
        )


def rules_record(rules: RulesInForce) -> dict[str, Any]:
    return {
        "type": "rules",
        "confidential": sorted(rules.confidential),
        "tally": list(rules.tally) if rules.tally else None,
        "overdrawn": rules.overdrawn,
    }


def batch_record(item: int, changes: Sequence[LedgerChange]) -> dict[str, Any]:
    values: dict[str, int] = {}
    for change in changes:
        values[change.name] = change.value
    return {
        "type": "batch",
        "item": item,
        "changes": [c.to_json() for c in changes],
        "values": values,
    }


def snapshot_record(item: int, values: Mapping[str, int]) -> dict[str, Any]:
    return {"type": "snapshot", "item": item, "values": dict(values)}


class Ledger:
    """Per-counter histories, built batch by batch (by the generator) or loaded from a file."""

    def __init__(self, rules: RulesInForce = _NO_RULES) -> None:
        self.rules = rules
        self._items: dict[str, list[int]] = {}
        self._values: dict[str, list[int]] = {}
        self._changes: list[tuple[LedgerChange, ...]] = [()]  # index 0 unused: items count from 1
        self.current: dict[str, int] = {}
        """Every counter's value after the last recorded batch (read-only by convention)."""

    @property
    def last_item(self) -> int:
        return len(self._changes) - 1

    def record(self, item: int, changes: Sequence[LedgerChange]) -> None:
        if item != self.last_item + 1:
            raise ValueError(
                f"batches must be recorded in order: expected item {self.last_item + 1}, got {item}"
            )
        self._changes.append(tuple(changes))
        ended: dict[str, int] = {}
        for change in changes:
            ended[change.name] = change.value
        for name, value in ended.items():
            self._items.setdefault(name, []).append(item)
            self._values.setdefault(name, []).append(value)
            self.current[name] = value

    def value_at(self, name: str, item: int) -> int | None:
        """The value ``name`` held at the end of ``item``; None if it had not been set yet."""
        items = self._items.get(name)
        if not items:
            return None
        index = bisect_right(items, item) - 1
        return self._values[name][index] if index >= 0 else None

    def changes_in(self, item: int) -> tuple[LedgerChange, ...]:
        if not 1 <= item <= self.last_item:
            return ()
        return self._changes[item]

    def changed_items(self, name: str) -> Sequence[int]:
        """The items in which ``name`` changed, ascending."""
        return tuple(self._items.get(name, ()))

    def last_change(self, name: str, up_to: int | None = None) -> int | None:
        """The last item up to ``up_to`` (default: the end) in which ``name`` changed."""
        items = self._items.get(name)
        if not items:
            return None
        if up_to is None:
            return items[-1]
        index = bisect_right(items, up_to) - 1
        return items[index] if index >= 0 else None

    def first_actor(self, name: str, item: int) -> str | None:
        """Who made the first change to ``name`` in ``item``; None if it did not change there."""
        for change in self.changes_in(item):
            if change.name == name:
                return change.actor
        return None

    def changes_of(self, name: str, up_to: int | None = None) -> list[tuple[int, LedgerChange]]:
        """Every change to ``name`` up to item ``up_to`` (default: the end), with its item, in
        story order (several in one item stay in their order)."""
        return [
            (item, change)
            for item in self.changed_items(name)
            if up_to is None or item <= up_to
            for change in self.changes_in(item)
            if change.name == name
        ]

    def count_changes(self, name: str, first: int, last: int) -> int:
        """How many changes ``name`` had in items ``first`` to ``last``."""
        return sum(
            1
            for item in self.changed_items(name)
            if first <= item <= last
            for change in self.changes_in(item)
            if change.name == name
        )

    def names(self) -> frozenset[str]:
        return frozenset(self._items)

    def snapshot(self, item: int) -> dict[str, int]:
        """Every counter's value at the end of ``item`` (counters not yet set are absent)."""
        values: dict[str, int] = {}
        for name in self._items:
            value = self.value_at(name, item)
            if value is not None:
                values[name] = value
        return values

    @classmethod
    def load(cls, path: Path | str) -> Ledger:
        """Read ``ledger.jsonl`` (or a stream folder holding one), checking every snapshot."""
        file = Path(path)
        if file.is_dir():
            file = file / LEDGER_FILE
        if not file.exists():
            raise FileNotFoundError(
                f"no ledger at {file}: generate the stream first (keeper-bench generate)"
            )
        ledger = cls()
        for line_number, record in _records(file):
            kind = record.get("type")
            if kind == "rules":
                tally = record.get("tally")
                ledger.rules = RulesInForce(
                    frozenset(record.get("confidential", ())),
                    (int(tally[0]), int(tally[1])) if tally else None,
                    bool(record.get("overdrawn", False)),
                )
            elif kind == "batch":
                changes = [LedgerChange.from_json(c) for c in record["changes"]]
                ledger.record(int(record["item"]), changes)
            elif kind == "snapshot":
                item = int(record["item"])
                if ledger.snapshot(item) != record["values"]:
                    raise ValueError(
                        f"{file} line {line_number}: the snapshot after item {item} disagrees with "
                        "the changes before it; the ledger is damaged, regenerate the stream"
                    )
            else:
                raise ValueError(f"{file} line {line_number}: unknown record type {kind!r}")
        return ledger


def _records(file: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with file.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if line.strip():
                try:
                    yield line_number, json.loads(line)
                except json.JSONDecodeError as error:
                    raise ValueError(f"{file} line {line_number} is not JSON: {error}") from error
