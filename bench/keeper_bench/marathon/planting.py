"""Choose and check the marathon's defects: seeded, one per function, each breaking only its own tests.

A candidate (``defects.candidate_defects``) is kept when, planted alone, it makes at least one of
its function's own tests fail (a defect no test notices cannot be ticketed) and nothing else fail
(a defect in a helper that breaks twenty other functions is not one ticket). The check runs the
real test suite, so a plan is worth keeping: it is stored as JSON beside the cache and reused.
"""

from __future__ import annotations

import json
import random
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from keeper_bench.marathon.defects import Defect, candidate_defects, plant
from keeper_bench.marathon.testrun import (
    TestOutcome,
    own_test_classes,
    run_tests,
    test_classes,
)

LIBRARY_FILES = ("more_itertools/more.py", "more_itertools/recipes.py")
OWN_TESTS_TIMEOUT = 30.0
"""Seconds for one function's tests; a planted defect that makes them loop is dropped."""


@dataclass(frozen=True, slots=True)
class PlantedDefect:
    defect: Defect
    failing: tuple[str, ...]
    """The tests this defect alone makes fail (all of them its function's own)."""
    reason: str
    """pytest's one-line reason for the first failing test: the symptom a ticket reports."""

    def to_json(self) -> dict[str, object]:
        return {
            "defect": self.defect.to_json(),
            "failing": list(self.failing),
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> PlantedDefect:
        defect = data["defect"]
        failing = data["failing"]
        assert isinstance(defect, dict) and isinstance(failing, list)
        return cls(Defect.from_json(defect), tuple(str(t) for t in failing), str(data["reason"]))


Progress = Callable[[str], None]


def choose_defects(
    project: Path,
    *,
    seed: int,
    count: int,
    progress: Progress | None = None,
    group: int = 8,
) -> list[PlantedDefect]:
    """Plant-and-check candidates in seeded order until ``count`` are kept; leaves files as found.

    Each candidate is first run against its own tests alone (cheap: most one-token changes go
    unnoticed and are dropped here). Survivors are checked against the whole suite in groups of
    ``group`` (one defect per function): a group is accepted when every failure belongs to a
    member's own tests and each member's own failures are what it caused alone; a group that
    fails anything else is split and its members checked one by one. That keeps the whole-suite
    runs to a few per plan instead of one per defect.
    """
    say = progress or (lambda _message: None)
    originals = {name: (project / name).read_text() for name in LIBRARY_FILES}
    classes = test_classes(project)
    candidates = [
        defect for name in LIBRARY_FILES for defect in candidate_defects(name, originals[name])
    ]
    random.Random(seed).shuffle(candidates)
    kept: list[PlantedDefect] = []
    used: set[str] = set()
    pending: list[tuple[Defect, frozenset[str], str]] = []

    def write(defects: list[Defect]) -> None:
        for name in LIBRARY_FILES:
            text = originals[name]
            for defect in sorted(
                (d for d in defects if d.path == name), key=lambda d: (d.line, d.col), reverse=True
            ):
                text = plant(text, defect)
            (project / name).write_text(text)

    def settle(batch: list[tuple[Defect, frozenset[str], str]]) -> None:
        write([defect for defect, _, _ in batch])
        try:
            outcome = run_tests(project, timeout=OWN_TESTS_TIMEOUT * 20)
        except subprocess.TimeoutExpired:  # a member hangs some other test
            outcome = None
        if outcome is None:
            if len(batch) > 1:
                for member in batch:
                    settle([member])
            return
        owned = {d.function: own_test_classes(d.function, classes) for d, _, _ in batch}
        clean = all(
            any(
                test.startswith(prefix + "::") for prefixes in owned.values() for prefix in prefixes
            )
            for test in outcome.failed
        ) and all(
            {t for t in outcome.failed if any(t.startswith(p + "::") for p in owned[d.function])}
            == alone
            for d, alone, _ in batch
        )
        if clean:
            for defect, alone, reason in batch:
                if len(kept) < count:
                    kept.append(PlantedDefect(defect, tuple(sorted(alone)), reason))
                    say(f"defect {len(kept)}/{count}: {defect.function} ({defect.kind})")
        elif len(batch) > 1:
            for member in batch:
                settle([member])
        else:
            used.discard(batch[0][0].function)  # it leaks into other tests: try another place

    try:
        for defect in candidates:
            if len(kept) + len(pending) >= count:
                break
            own = own_test_classes(defect.function, classes)
            if defect.function in used or not own:
                continue
            write([defect])
            try:
                alone = run_tests(project, own, timeout=OWN_TESTS_TIMEOUT)
            except subprocess.TimeoutExpired:
                continue  # it loops for ever: a hang is not a ticket
            if not alone.failed or not _only_own(alone, own):
                continue  # no test notices it
            first = sorted(alone.failed)[0]
            pending.append((defect, alone.failed, alone.reasons.get(first, "")))
            used.add(defect.function)
            if len(pending) == group or len(kept) + len(pending) >= count:
                settle(pending)
                pending = []
        if pending:
            settle(pending)
    finally:
        for name, text in originals.items():
            (project / name).write_text(text)
    if len(kept) < count:
        raise RuntimeError(f"only {len(kept)} defects of {count} could be planted with seed {seed}")
    return kept


def _only_own(outcome: TestOutcome, own: list[str]) -> bool:
    return all(any(test.startswith(prefix + "::") for prefix in own) for test in outcome.failed)


def plant_all(project: Path, planted: list[PlantedDefect]) -> None:
    """Write every defect into the library files (several may share a file)."""
    for name in LIBRARY_FILES:
        text = (project / name).read_text()
        # bottom-up, so earlier positions stay valid; one defect per token
        for item in sorted(
            (p for p in planted if p.defect.path == name),
            key=lambda p: (p.defect.line, p.defect.col),
            reverse=True,
        ):
            text = plant(text, item.defect)
        (project / name).write_text(text)


def plan_path(cache: Path, seed: int, count: int) -> Path:
    return cache / f"plan-seed{seed}-{count}.json"


SHIPPED_PLANS = Path(__file__).parent / "plans"
"""Plans made with ``keeper-bench marathon-plan`` and kept with the package, so a run (and CI)
need not spend minutes re-checking candidates; each defect in them was checked alone."""


def _stored_plan(folder: Path, seed: int, count: int) -> list[PlantedDefect] | None:
    """A stored plan for ``seed`` with at least ``count`` defects (its first ``count`` are used:
    each was checked alone, so a prefix is a valid smaller plan)."""
    for path in sorted(folder.glob(f"plan-seed{seed}-*.json")):
        stored = [PlantedDefect.from_json(item) for item in json.loads(path.read_text())]
        if len(stored) >= count:
            return stored[:count]
    return None


def load_or_choose(
    project: Path, cache: Path, *, seed: int, count: int, progress: Progress | None = None
) -> list[PlantedDefect]:
    """A shipped or cached plan for (seed, count), or a new one chosen now and cached."""
    for folder in (SHIPPED_PLANS, cache):
        stored = _stored_plan(folder, seed, count)
        if stored is not None:
            return stored
    path = plan_path(cache, seed, count)
    planted = choose_defects(project, seed=seed, count=count, progress=progress)
    cache.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".partial")
    temporary.write_text(json.dumps([item.to_json() for item in planted], indent=1))
    temporary.replace(path)
    return planted
