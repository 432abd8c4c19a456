"""The rows a cut writes, the same in every SQL store (pure).

SQLite and PostgreSQL keep one table layout and write a cut alike: the cut's record (with its
parent, its place in the session's order and the NOTES version in effect after it), the NOTES
version written with it, the records of the turns its branch does not hold yet, numbered on from
the session's last sequence number, and links to records another branch archived first. Only the
placeholders, the transaction and how long texts are encoded differ, so the rows are built here
once and each store only runs its statements.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from keeper_middleware.archive.records import ArchivedTurn, Chain, CutRecord, NotesDraft
from keeper_middleware.errors import ConfigurationError
from keeper_middleware.retrievers.base import Spans

CutRow = tuple[int, int, int]
"""A cut as a chain reads it: (ordinal, first_seq, records archived)."""
TreeRow = tuple[str, int, int, int]
"""A row of a branch's tree query: ("cut", ordinal, first_seq, archived) or ("link", ordinal
of the linking cut, seq, place)."""

TURN_COLUMNS = (
    "session, msg_id, item, role, content, tool_calls_json, tool_call_id, name, reasoning, seq, "
    "digest"
)
NOTES_COLUMNS = "session, version, first_item, last_item, text, data_json, cut_key, created"
CUT_COLUMNS = "session, cut_key, turns_archived, notes_version, created, parent, ordinal"
CUT_INSERT_COLUMNS = f"{CUT_COLUMNS}, first_seq, notes_at"


def require_cut_key(cut_key: str) -> None:
    if not isinstance(cut_key, str) or not cut_key:
        raise ConfigurationError(f"cut_key must be a non-empty string, got {cut_key!r}")


@dataclass(frozen=True, slots=True)
class Placed:
    """Where a cut's turns go: new records, and records of another branch to link."""

    new: list[ArchivedTurn]
    links: list[tuple[int, int]]
    """(seq, place) of each record another branch archived first: ``place`` is where it stands
    among the records the cut brings onto its branch (new and linked, in the cut's order)."""


def place_turns(
    turns: Sequence[ArchivedTurn],
    stored: Mapping[tuple[str, str], int],
    sees: Callable[[int], bool],
) -> Placed:
    """Which of a cut's turns are new records, which are linked, which the branch already holds.

    ``stored`` maps the (message id, digest) of records already in the session to their
    ``seq``; ``sees(seq)`` says whether the cut's branch (up to its parent) holds that record.
    A record the branch holds is skipped (a turn is archived once per branch); one only another
    branch holds is linked (nothing is copied); anything else is a new record.
    """
    new: list[ArchivedTurn] = []
    links: list[tuple[int, int]] = []
    linked: set[int] = set()
    for turn in turns:
        seq = stored.get(turn.key)
        if seq is None:
            new.append(turn)
        elif not sees(seq) and seq not in linked:
            links.append((seq, len(new) + len(links)))
            linked.add(seq)
    return Placed(new=new, links=links)


@dataclass(frozen=True, slots=True)
class CutRows:
    """What one cut inserts, in the columns' order (turn rows end with their ``cut_key``)."""

    record: CutRecord
    cut: tuple[object, ...]
    notes: tuple[object, ...] | None
    turns: list[tuple[object, ...]]


def cut_rows(
    session: str,
    cut_key: str,
    new: Sequence[ArchivedTurn],
    notes: NotesDraft | None,
    *,
    notes_version: int | None,
    first_seq: int,
    created: float,
    parent: str | None = None,
    ordinal: int = 0,
    notes_at: int | None = None,
    text: Callable[[str], object] = lambda kept: kept,
) -> CutRows:
    """The rows of a cut that archives ``new`` (the turns its branch does not hold) and writes
    ``notes`` as ``notes_version``, after ``parent``; ``notes_at`` is the version in effect after
    it (its own, else its parent's). ``text`` encodes the long texts as the store keeps them."""
    record = CutRecord(
        session=session,
        cut_key=cut_key,
        turns_archived=len(new),
        notes_version=notes_version,
        created=created,
        parent=parent,
        ordinal=ordinal,
    )
    notes_row = None
    if notes is not None:
        notes_row = (
            session,
            notes_version,
            notes.first_item,
            notes.last_item,
            text(notes.text),
            notes.data_json,
            cut_key,
            created,
        )
    turn_rows: list[tuple[object, ...]] = [
        (
            session,
            t.msg_id,
            t.item,
            t.role,
            text(t.content),
            t.tool_calls_json,
            t.tool_call_id,
            t.name,
            text(t.reasoning),
            first_seq + i,
            t.digest,
            cut_key,
        )
        for i, t in enumerate(new)
    ]
    cut_row = (
        session,
        cut_key,
        record.turns_archived,
        record.notes_version,
        record.created,
        parent,
        ordinal,
        first_seq,
        notes_version if notes_version is not None else notes_at,
    )
    return CutRows(record=record, cut=cut_row, notes=notes_row, turns=turn_rows)


def chain_spans(
    cuts: Sequence[tuple[int, int, int]], links: Sequence[tuple[int, int, int]]
) -> tuple[Spans, Spans]:
    """The ordinals and the records (seq) of a branch, the records in the branch's own order:
    from its cuts' (ordinal, first_seq, records archived) and its links' (ordinal of the cut,
    seq, place among what the cut brought)."""
    ordinals = Spans.of([(0, 1), *((ordinal, ordinal + 1) for ordinal, _, _ in cuts)])
    placed: dict[int, dict[int, int]] = {}
    for ordinal, seq, place in links:
        placed.setdefault(ordinal, {})[place] = seq
    walk: list[tuple[int, int]] = []
    for ordinal, first, count in sorted(cuts):
        places = placed.get(ordinal)
        if not places:
            walk.append((first, first + count))
            continue
        owned = first
        for place in range(count + len(places)):
            linked = places.get(place)
            if linked is None:
                linked, owned = owned, owned + 1
            walk.append((linked, linked + 1))
    return ordinals, Spans.ordered(walk)


def chain_from(
    session: str,
    head: str | None,
    *,
    tip: str | None,
    forked: bool,
    read_cut: Callable[[], CutRow | None],
    read_tree: Callable[[], Sequence[TreeRow]],
    unknown: Callable[[], Exception],
) -> Chain:
    """The branch whose latest cut is ``head``, in a session whose latest cut is ``tip``
    (``forked``: some cut has a sibling). A session that never forked is one line: at its tip a
    branch sees everything; before it, the cuts and records up to the head (``read_cut`` reads
    the head's row). A forked one reads the head's tree of cuts and links (``read_tree``)."""
    if head is None:
        return Chain(session, None, whole=tip is None, ordinals=Spans(((0, 1),)))
    if not forked:
        if head == tip:
            return Chain(session, head, whole=True)
        row = read_cut()
        if row is None:
            raise unknown()
        ordinal, first, archived = row
        return Chain(
            session,
            head,
            whole=False,
            ordinals=Spans.of([(0, ordinal + 1)]),
            seqs=Spans.of([(0, first + archived)]),
        )
    tree = read_tree()
    cuts = [(int(r[1]), int(r[2]), int(r[3])) for r in tree if r[0] == "cut"]
    if not cuts:
        raise unknown()
    links = [(int(r[1]), int(r[2]), int(r[3])) for r in tree if r[0] == "link"]
    ordinals, seqs = chain_spans(cuts, links)
    return Chain(session, head, whole=False, ordinals=ordinals, seqs=seqs)
