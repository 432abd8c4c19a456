"""A list kept in a store of per-session values as it grows, each save writing what is new.

A long-running session's lists (a proxy's window, the fingerprints it took in, the keeper's ids
in view) only grow between cuts, and are saved at every request: written whole, or even by
rewriting their last chunk, a save costs more as they grow. Kept as full chunks and a few small
pieces (:class:`StoredList`), a save writes the new entries as a piece and, now and then, a full
chunk (:func:`store_list`); the owner's head names the chunks, so a save cut short leaves the
previous head and everything it names intact.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from keeper_middleware.errors import MalformedDataError

__all__ = ["StoredList", "store_list"]

_first: Callable[[tuple[int, int]], int] = itemgetter(0)
_second: Callable[[tuple[int, int]], int] = itemgetter(1)


@dataclass(frozen=True, slots=True)
class StoredList:
    """A list as a store of per-session values holds it, in chunks.

    Full chunks of ``size`` entries come first, then a few smaller pieces. A save writes what
    is new as a piece, joined with the last pieces when they are not larger (so there are
    never more than a few, and an entry is written again only a few times), and once the
    pieces fill a chunk they are written as full chunks. A full chunk's key holds its place and
    the generation that wrote it; full chunks written one after another share one (the run's),
    so a head names them in a few numbers however long the list grows. Where the pieces are
    kept is the owner's choice (:func:`store_list` hands each save's piece back)."""

    size: int = 0
    runs: tuple[tuple[int, int], ...] = ()
    """The full chunks: (generation, how many in a row) in order."""
    pieces: tuple[tuple[int, int], ...] = ()
    """The pieces after them: (entries, generation) in order."""
    columns: tuple[Sequence[Any], ...] = ()
    """The entries as last saved (one sequence per column), compared with the next save's."""

    @property
    def full(self) -> int:
        return sum(map(_second, self.runs))

    @property
    def length(self) -> int:
        return self.size * self.full + sum(map(_first, self.pieces))

    def keys(self, prefix: str, first_full: int = 0) -> list[str]:
        """The keys of the full chunks from ``first_full`` on, in order."""
        keys: list[str] = []
        place = 0
        for made, alike in self.runs:
            keys += (f"{prefix}.{n}.{made}" for n in range(max(place, first_full), place + alike))
            place += alike
        return keys

    def to_json(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "runs": list(map(list, self.runs)),
            "pieces": list(map(list, self.pieces)),
        }

    @classmethod
    def from_json(cls, data: object) -> StoredList:
        if not isinstance(data, dict):
            raise MalformedDataError(f"a stored list's head is {data!r}, not a mapping")
        return cls(
            int(data["size"]),
            tuple((int(made), int(alike)) for made, alike in data["runs"]),
            tuple((int(count), int(made)) for count, made in data["pieces"]),
        )


def _common(before: Sequence[Sequence[Any]], after: Sequence[Sequence[Any]], length: int) -> int:
    """How many leading entries ``after`` shares with the ``length`` saved in ``before``: one
    comparison of whole sequences when entries were only appended (the same objects compare
    by identity), entry by entry otherwise (after a cut or an edit)."""
    if not before:
        return 0
    if len(after[0]) >= length:
        for b, a in zip(before, after, strict=True):
            if (b if len(b) == length else b[:length]) != a[:length]:
                break
        else:
            return length
    shared = min(length, len(after[0]))
    for n in range(shared):
        if any(b[n] != a[n] for b, a in zip(before, after, strict=True)):
            return n
    return shared


def store_list(
    prefix: str,
    before: StoredList,
    after: tuple[Sequence[Any], ...],
    generation: int,
    writes: dict[str, Any],
    stored: Callable[[int, int], list[Any]],
) -> tuple[StoredList, list[str], list[Any] | None]:
    """(``after`` stored, the keys of ``before``'s full chunks it no longer uses, the piece
    this save writes or None): what ``after`` shares with ``before`` is kept, the rest written.

    Args:
        prefix: the keys' start; a full chunk's key is ``{prefix}.{place}.{generation}``.
        before: the list as last saved (an empty one gives the size of full chunks).
        after: the list now, as columns of equal length (the same objects as last saved for
            the entries that did not change: they are compared by identity first).
        generation: the number of this save, new to every save of the list's owner.
        writes: where the full chunks to write are added (key to stored form).
        stored: the stored form of entries ``start:end`` of ``after``.
    """
    size, before_runs = before.size, before.runs
    before_full = sum(map(_second, before_runs))  # ``before.full``
    length = size * before_full + sum(map(_first, before.pieces))  # ``before.length``
    common = _common(before.columns, after, length)
    full = common // size
    if full > before_full:
        full = before_full
    pieces: list[tuple[int, int]] = []
    end = full * size
    if full == before_full:
        for count, made in before.pieces:
            if end + count > common:
                break
            pieces.append((count, made))
            end += count
    # every full chunk kept (most saves): the runs as they were
    runs = list(before_runs) if full == before_full else _first_runs(before_runs, full)
    total = len(after[0])
    start = end
    if total > end:
        if total - full * size >= size:  # the pieces and the new entries fill a chunk
            start, pieces = full * size, []
        else:  # joined with the pieces before them that are not larger
            while pieces and pieces[-1][0] <= total - start:
                start -= pieces.pop()[0]
        # full chunks go on with the last run's generation when none of it was dropped
        made = runs[-1][0] if runs and full == before_full else generation
        while total - start >= size:
            writes[f"{prefix}.{full}.{made}"] = stored(start, start + size)
            runs = _grown(runs, made)
            full += 1
            start += size
    piece = None
    if total > start:
        piece = stored(start, total)
        pieces.append((total - start, generation))
    saved = StoredList(size, tuple(runs), tuple(pieces), after)
    if saved.runs == before.runs:  # every full chunk kept (most saves): none retired
        return saved, [], piece
    return saved, _retired(prefix, before, saved), piece


def _first_runs(runs: Sequence[tuple[int, int]], full: int) -> list[tuple[int, int]]:
    """The runs of the first ``full`` full chunks."""
    kept: list[tuple[int, int]] = []
    for made, alike in runs:
        if full <= 0:
            break
        kept.append((made, min(alike, full)))
        full -= alike
    return kept


def _grown(runs: list[tuple[int, int]], made: int) -> list[tuple[int, int]]:
    """``runs`` and one more full chunk written by generation ``made``."""
    if runs and runs[-1][0] == made:
        return [*runs[:-1], (made, runs[-1][1] + 1)]
    return [*runs, (made, 1)]


def _retired(prefix: str, before: StoredList, after: StoredList) -> list[str]:
    """The keys of ``before``'s full chunks that ``after`` no longer uses: it keeps a leading
    part of them and writes the rest anew."""
    full = before.full
    if after.runs != before.runs:
        old = [made for made, alike in before.runs for _ in range(alike)]
        new = [made for made, alike in after.runs for _ in range(alike)]
        full = next(
            (n for n, (a, b) in enumerate(zip(old, new, strict=False)) if a != b),
            min(full, len(new)),
        )
    return before.keys(prefix, full)
