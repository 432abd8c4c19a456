"""A small real file system for tests of a full disk: a tmpfs mounted for one test.

``small_disk`` (a fixture in ``conftest.py``) mounts one where the test can (root, and a working
``mount``), and otherwise skips the test saying why; ``fill`` takes what space is left.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest


def mounted_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` at ``where`` (made if missing) for the ``with`` block; skip
    the test, with the reason, where that is not possible."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a small file system needs root and mount(8) to make (tmpfs)")
    where.mkdir(parents=True, exist_ok=True)
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path, leave: int = 0) -> Path:
    """Fill ``disk`` until at most ``leave`` bytes are free; returns the filler file."""
    filler = disk / f"filler-{uuid.uuid4().hex}"
    with filler.open("wb") as out:
        while True:
            free = shutil.disk_usage(disk).free
            if free <= leave:
                break
            try:
                out.write(b"\0" * min(64 * 1024, free - leave))
                out.flush()
            except OSError:
                break
    return filler
