"""The repair marathon's code base: more-itertools 10.7.0, from the package registry.

The source distribution (library *and* its test suite; the wheel has no tests) is downloaded once,
at install time (``make setup`` runs ``keeper-bench marathon-fetch``), into a cache folder outside
the repository, and checked against a pinned digest. A marathon only unpacks that file: nothing is
fetched while it runs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "more-itertools"
VERSION = "10.7.0"
SDIST_NAME = f"more_itertools-{VERSION}.tar.gz"
SDIST_SHA256 = "9fddd5403be01a94b204faadcff459ec3568cf110265d3c54323e1e866ad29d3"
CACHE_ENV = "KEEPER_MARATHON_CACHE"


class SourceMissingError(RuntimeError):
    """The pinned source distribution is not in the cache (set-up has not fetched it)."""


def cache_dir() -> Path:
    """Where the source distribution is kept: ``$KEEPER_MARATHON_CACHE`` or the user cache."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "keeper-middleware" / "marathon"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cached_sdist() -> Path:
    """The verified source distribution, or a :class:`SourceMissingError` that says how to get it."""
    path = cache_dir() / SDIST_NAME
    if not path.exists():
        raise SourceMissingError(
            f"{SDIST_NAME} is not in {path.parent}; fetch it once at install time with "
            "`keeper-bench marathon-fetch` (make setup does this)"
        )
    if _digest(path) != SDIST_SHA256:
        raise SourceMissingError(
            f"{path} does not match the pinned sha256 of {PACKAGE} {VERSION}; delete it and run "
            "`keeper-bench marathon-fetch` again"
        )
    return path


def fetch_sdist() -> Path:
    """Download the pinned source distribution with pip (an install-time step), then verify it."""
    target = cache_dir()
    target.mkdir(parents=True, exist_ok=True)
    if (target / SDIST_NAME).exists() and _digest(target / SDIST_NAME) == SDIST_SHA256:
        return target / SDIST_NAME
    with tempfile.TemporaryDirectory(dir=target) as scratch:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"{PACKAGE}=={VERSION}",
                "-d",
                scratch,
            ],
            check=True,
        )
        shutil.move(str(Path(scratch) / SDIST_NAME), target / SDIST_NAME)
    return cached_sdist()


def unpack_source(destination: Path) -> Path:
    """Unpack the library and its tests into ``destination`` (created); returns the project root."""
    destination.mkdir(parents=True, exist_ok=True)
    with tarfile.open(cached_sdist()) as archive:
        members = [
            member
            for member in archive.getmembers()
            if member.isfile()
            and member.name.split("/", 1)[-1].startswith(("more_itertools/", "tests/"))
        ]
        archive.extractall(destination, members=members, filter="data")
    root = destination / f"more_itertools-{VERSION}"
    return root
