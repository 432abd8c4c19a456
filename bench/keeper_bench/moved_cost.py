"""What a cut pays for the entries that left the NOTES, as the number ever moved grows.

Run: ``keeper-bench moved-cost [--moved 0,1000,5658,20000,100000] [--cuts 40] [--out FILE]``.

Synthetic and bounded (seconds per size): a real SQLite archive file holds ``N`` moved entries,
and each timed cut does this part of a cut's work both ways, on a noted text of ~3,000
characters that names 6 moved keys among other words, with 410 entries in the NOTES, 10 entries
moving out and 2 recalled ones set again:

- "two values" (the layout before rows): read the moved keys and entries (two JSON values), scan
  every moved key against the text (``named_in``), fold every key for the checks, rebuild both
  and write both back;
- "rows": read the candidate rows by the text's words (``moved_named``) and decide among them
  (``named_in``), look up the tracked names the text gives (``moved_among``), write the change
  (``update_moved``; in a cut it rides in the cut's own transaction, here it commits alone).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

from keeper_middleware.archive.moved_rows import LEGACY_ENTRIES, LEGACY_KEYS, words_of
from keeper_middleware.archive.sqlite import SQLiteArchive
from keeper_middleware.notes.block import Notes
from keeper_middleware.notes.recall import moved_update, named_in, track_moved

_SYLLABLES = ("ba", "do", "ri", "te", "lo", "nu", "di", "mi", "ka", "se", "fo", "gu")
_FIRST = tuple(
    [
        "Ada",
        "Bo",
        "Cy",
        "Dee",
        "Eli",
        "Fay",
        "Gus",
        "Hal",
        "Ida",
        "Jo",
        "Kit",
        "Lu",
        "Max",
        "Ned",
        "Oz",
        "Pia",
        "Quin",
        "Rex",
        "Sol",
        "Tam",
    ]
)
_FILLER = "The counter went on quietly while the team checked the ledger again. "


def _name(rng: random.Random, n: int) -> str:
    """A counter name like the benchmark's (``badori42``); every 50th a two-word name, its first
    word one of 20 (rows that share the first word of a named key are all read)."""
    word = "".join(rng.choice(_SYLLABLES) for _ in range(3)) + f"{n % 100:02d}"
    return f"{_FIRST[n // 50 % 20]} {word.title()}" if n % 50 == 0 else word


class _Cuts:
    """The keys and texts of a run of cuts over ``count`` moved entries."""

    def __init__(self, count: int, cuts: int, seed: int = 0) -> None:
        rng = random.Random(seed)
        names: dict[str, None] = {}
        while len(names) < count + 410 + 10 * cuts:
            names[_name(rng, len(names))] = None
        pool = list(names)
        self.moved = {key: str(rng.randrange(1000)) for key in pool[:count]}
        self.held = pool[count : count + 410]
        self.fresh = pool[count + 410 :]
        self.rng = rng

    def cut(self, index: int, moved: Collection[str]) -> tuple[str, Notes, list[tuple[str, str]]]:
        named = self.rng.sample(list(moved), min(6, len(moved)))
        others = self.rng.sample(self.held, 14)
        sentences = [f"Today {key} rose by {i + 2} to {i * 7}." for i, key in enumerate(named)]
        sentences += [f"We set {key} to {i}." for i, key in enumerate(others)]
        self.rng.shuffle(sentences)
        text = (" ".join(sentences) + " " + _FILLER * 25)[:3000]
        back = named[:2]
        notes = Notes(state=tuple((key, "1") for key in [*self.held, *back]))
        out = [(key, "5") for key in self.fresh[10 * index : 10 * index + 10]]
        return text, notes, out


def _two_values(archive: SQLiteArchive, cuts: _Cuts, count: int) -> list[float]:
    archive.put_value("s", LEGACY_KEYS, list(cuts.moved))
    archive.put_value("s", LEGACY_ENTRIES, cuts.moved)
    times = []
    for index in range(count):
        text, notes, out = cuts.cut(index, archive.get_value("s", LEGACY_ENTRIES) or {})
        start = time.perf_counter()
        keys = frozenset(archive.get_value("s", LEGACY_KEYS) or ())
        entries = dict(archive.get_value("s", LEGACY_ENTRIES) or {})
        named = named_in(entries, text)
        back = named[:2]
        frozenset(key.casefold() for key in keys - set(back))  # what the checks were given
        before = archive.get_value("s", LEGACY_KEYS) or []
        held = {key for key, _ in notes.state}
        kept = [key for key in before if key not in held] + [key for key, _ in out]
        archive.put_value("s", LEGACY_KEYS, list(dict.fromkeys(kept)))
        archive.put_value("s", LEGACY_ENTRIES, track_moved(entries, notes, out, back=back))
        times.append(time.perf_counter() - start)
    return times


def _rows(archive: SQLiteArchive, cuts: _Cuts, count: int) -> list[float]:
    archive.update_moved("s", moved_update(Notes(), list(cuts.moved.items())))
    times = []
    for index in range(count):
        live = {key: value for key, value in archive.moved_rows("s") if value is not None}
        text, notes, out = cuts.cut(index, live)
        start = time.perf_counter()
        candidates = dict(archive.moved_named("s", words_of(text)))
        named = named_in(candidates, text)
        back = named[:2]
        archive.moved_among("s", {word for word in words_of(text) if word[-1:].isdigit()})
        before = cuts.held
        archive.update_moved("s", moved_update(notes, out, back=back, held_before=before))
        times.append(time.perf_counter() - start)
    return times


def measure(sizes: Sequence[int], cuts: int) -> list[tuple[int, float, float]]:
    """(moved entries, ms a cut with two values, ms a cut with rows), medians."""
    found = []
    for size in sizes:
        row: list[float] = []
        for way in (_two_values, _rows):
            with tempfile.TemporaryDirectory() as folder:
                archive = SQLiteArchive(Path(folder) / "archive.sqlite3")
                try:
                    row.append(1000 * statistics.median(way(archive, _Cuts(size, cuts), cuts)))
                finally:
                    archive.close()
        found.append((size, row[0], row[1]))
    return found


def table(results: Sequence[tuple[int, float, float]]) -> str:
    lines = [
        "| moved entries | two JSON values, ms a cut | one row each, ms a cut |",
        "| --- | --- | --- |",
    ]
    lines += [f"| {size:,} | {old:.2f} | {new:.2f} |" for size, old, new in results]
    return "\n".join(lines)


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--moved", default="0,1000,5658,20000,100000")
    parser.add_argument("--cuts", type=int, default=40)
    parser.add_argument("--out", type=Path)


def _run(args: argparse.Namespace) -> int:
    sizes = [int(part) for part in args.moved.split(",") if part.strip()]
    load = os.getloadavg()
    text = (
        f"{table(measure(sizes, args.cuts))}\n\nmedian of {args.cuts} cuts per size, "
        f"load average at the start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


def register_commands(register: Callable[[Any], None]) -> None:
    """Adds ``keeper-bench moved-cost``."""
    from keeper_bench.cli import Command

    register(
        Command("moved-cost", "a cut's cost for moved NOTES entries, by count", _configure, _run)
    )
