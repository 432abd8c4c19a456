"""A chroma folder cut short in a write is set aside before chromadb opens it.

A process stopped (SIGTERM, SIGKILL, power loss) while chromadb writes its HNSW segment can
leave files that chromadb's native code cannot read: measured on a 1M-sentence build stopped in
a write, ``link_lists.bin`` claimed 2.66 TB (a sparse file) and every later ``count``, ``get``
or ``query`` crashed the whole process with a segmentation fault, so the keeper crashed on every
start. The index is derived from the archive, so such a folder is moved aside and opened empty;
the archive's catch-up (``keeper_middleware.search.indexing.reconcile``) then finds the index
holding none of what it indexed and builds it again from the archive.

Two signs are checked before the folder is opened, both without reading more than a header:

* a write marker: :func:`writing` creates ``.keeper-writing`` in the folder before each chroma
  write (an upsert or delete batch) and removes it once the write returns; one found when the
  folder is first opened in a process means a write was cut short;
* the HNSW segment's files against its ``header.bin`` (hnswlib's persisted layout): a file too
  short for the elements the header counts, or a ``link_lists.bin`` longer than those elements'
  links can be at the header's highest level, means the files do not belong together; so does
  an empty ``index_metadata.pickle`` (chroma truncates it to rewrite it: a process SIGKILLed in
  a 200K-passage build left one, and every later query failed "deserializing pickle file").
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import struct
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

MARKER = ".keeper-writing"
"""The file in a chroma folder that stands while a write is under way."""
ASIDE = ".damaged"
"""What a damaged folder's name gets when it is moved aside (one is kept: the last)."""

_HEADER = struct.Struct("<iQQQQQQiIQQQdQ")
"""hnswlib's persisted header (chroma's fork): version, offsetLevel0, max_elements,
cur_element_count, size_data_per_element, label_offset, offsetData, maxlevel, enterpoint_node,
maxM, maxM0, M, mult, ef_construction."""
_MAX_LEVEL = 64
"""Far above any level hnswlib draws (about ln(elements) / ln(M)); a header past it is garbage."""

_lock = threading.Lock()
_writes: Counter[Path] = Counter()
"""Writes under way in this process, a folder each (several indexes may share one)."""
_failed: set[Path] = set()
"""Folders a write of this process failed in: their marker stays for the next process."""
_opened: set[Path] = set()
"""Folders this process has opened: a marker found there is its own write's, not a cut one."""


@contextlib.contextmanager
def writing(folder: Path) -> Iterator[None]:
    """Stand the folder's write marker while the body writes to chroma.

    The marker holds the writer's process id, so a process opening the folder while another,
    still running, writes to it does not take the write for a cut one. It costs one file
    create and one unlink a write batch (not a passage; 48 us of CPU against 178 ms for an
    upsert of 256 vectors, ``bench/results/chroma_damage.md``). A write that
    raises keeps it, so the next process to open the folder rebuilds it rather than trust a
    segment that a failed native write may have left half written.
    """
    with _lock:
        if _writes[folder] == 0:
            (folder / MARKER).write_text(str(os.getpid()))
        _writes[folder] += 1
    ok = False
    try:
        yield
        ok = True
    finally:
        with _lock:
            _writes[folder] -= 1
            if not ok:
                _failed.add(folder)
            if _writes[folder] == 0:
                del _writes[folder]
                if folder not in _failed:
                    (folder / MARKER).unlink(missing_ok=True)


def damage(folder: Path) -> str | None:
    """Why the chroma folder cannot be trusted, or None when nothing says so (no folder yet,
    or one whose segments are not persisted yet, is fine)."""
    if (folder / MARKER).exists() and not _writer_running(folder / MARKER):
        return "a write to it was cut short (its write marker is still there)"
    for header in sorted(folder.glob("*/header.bin")):
        reason = segment_damage(header.parent)
        if reason is not None:
            return f"its vector segment {header.parent.name} is damaged: {reason}"
    return None


def _writer_running(marker: Path) -> bool:
    """Whether the marker's writer is another process still running (where that can be told)."""
    try:
        pid = int(marker.read_text().strip() or 0)
    except (OSError, ValueError):
        return False
    if pid <= 0 or pid == os.getpid() or os.name != "posix":
        return False  # this process opens the folder first, so any marker of its pid is old
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, run by another user
        return True
    return True


def segment_damage(segment: Path) -> str | None:
    """Why one HNSW segment's files do not match its header, or None when they do."""
    try:
        raw = (segment / "header.bin").read_bytes()
    except FileNotFoundError:  # deleted since it was listed
        return None
    if len(raw) < _HEADER.size:
        return f"header.bin holds {len(raw)} bytes, fewer than the {_HEADER.size} of a header"
    fields = _HEADER.unpack_from(raw)
    count, per_element, max_level, max_m = fields[3], fields[4], fields[7], fields[9]
    if not -1 <= max_level <= _MAX_LEVEL or count > fields[2]:
        return f"header.bin is not a valid header (level {max_level}, {count} elements)"
    sizes = {
        name: (segment / name).stat().st_size if (segment / name).exists() else 0
        for name in ("data_level0.bin", "length.bin", "link_lists.bin")
    }
    if sizes["data_level0.bin"] < count * per_element:
        return f"data_level0.bin holds {sizes['data_level0.bin']} bytes for {count} elements"
    if sizes["length.bin"] < count * 4:
        return f"length.bin holds {sizes['length.bin']} bytes for {count} elements"
    pickle = segment / "index_metadata.pickle"
    if pickle.exists() and pickle.stat().st_size == 0:  # rewritten whole: emptied, never filled
        return "index_metadata.pickle is empty"
    most_links = count * max(max_level, 0) * (max_m * 4 + 4)  # -1: no element yet
    if sizes["link_lists.bin"] > most_links:
        return (
            f"link_lists.bin claims {sizes['link_lists.bin']} bytes, more than the "
            f"{most_links} that {count} elements' links can take"
        )
    return None


def set_aside_if_damaged(folder: Path) -> Path | None:
    """Move the folder aside when :func:`damage` finds it cannot be trusted, the first time
    this process opens it; where it went, or None when it stays.

    A folder this process has opened already is not checked again: its marker may be a write
    of this process under way, and chromadb holds its files open.
    """
    folder = folder.resolve()
    with _lock:
        if folder in _opened:
            return None
        _opened.add(folder)
    reason = damage(folder) if folder.is_dir() else None
    if reason is None:
        return None
    aside = folder.with_name(folder.name + ASIDE)
    if aside.exists():  # the one set aside before: only the last is kept
        shutil.rmtree(aside)
    os.replace(folder, aside)
    logger.warning(
        "index set aside: the chroma folder %s cannot be opened safely, %s; it was moved to %s "
        "(delete it once it is not needed) and the index is rebuilt from the archive",
        folder,
        reason,
        aside,
    )
    return aside


def forget_opened() -> None:
    """Forget which folders this process opened, as a new process would (for tests)."""
    with _lock:
        _opened.clear()
        _failed.clear()
