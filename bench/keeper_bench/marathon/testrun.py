"""Run the code base's own test suite in a work folder and read which tests failed.

Each run is a fresh ``python -m pytest`` in the work folder, importing the work folder's copy of
the library (never an installed one), so what a test sees is exactly what is on disk.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+?)(?: - (.*))?$", re.MULTILINE)
TEST_FILES = ("tests/test_more.py", "tests/test_recipes.py")


@dataclass(frozen=True, slots=True)
class TestOutcome:
    failed: frozenset[str]
    """Node ids of failing tests, e.g. ``tests/test_more.py::ChunkedTests::test_even``."""
    reasons: dict[str, str]
    """A failing test's one-line reason, where pytest gave one."""
    log: str


def test_environment(project: Path) -> dict[str, str]:
    """The environment a test run (or the agent's shell) gets: the work folder's code first."""
    keep = {
        name: os.environ[name] for name in ("PATH", "HOME", "LANG", "TMPDIR") if name in os.environ
    }
    return {
        **keep,
        "PYTHONPATH": str(project),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        "COLUMNS": "400",  # pytest cuts failure reasons to the terminal's width
    }


def run_tests(
    project: Path, selection: Sequence[str] = TEST_FILES, timeout: float = 600
) -> TestOutcome:
    """Run the selected tests (files or node ids) and return what failed."""
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-rfE",
        "--tb=short",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        *selection,
    ]
    done = subprocess.run(
        command,
        cwd=project,
        env=test_environment(project),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    log = done.stdout + done.stderr
    failed: set[str] = set()
    reasons: dict[str, str] = {}
    for match in _FAILED.finditer(log):
        node = match.group(1)
        failed.add(node)
        if match.group(2):
            reasons[node] = match.group(2).strip()
    if done.returncode not in (0, 1) and not failed:
        raise RuntimeError(
            f"the test run did not complete (exit {done.returncode}):\n{log[-2000:]}"
        )
    return TestOutcome(frozenset(failed), reasons, log)


def test_classes(project: Path) -> dict[str, list[str]]:
    """Test classes by the library name they test: ``{"chunked": ["tests/test_more.py::ChunkedTests"]}``.

    The suite names a class after the function it tests (``ChunkedTests``, ``TestCollapse``,
    ``NthOrLastTest``); a class is matched to a function when the names agree once case,
    underscores and the Test/Tests affix are set aside.
    """
    by_key: dict[str, list[str]] = {}
    for test_file in TEST_FILES:
        for line in (project / test_file).read_text().splitlines():
            match = re.match(r"class (\w+)\(", line)
            if not match:
                continue
            name = match.group(1)
            key = re.sub(r"^tests?|tests?$", "", name.lower())
            by_key.setdefault(key, []).append(f"{test_file}::{name}")
    return by_key


def own_test_classes(function: str, classes: dict[str, list[str]]) -> list[str]:
    return classes.get(function.replace("_", "").lower(), [])
