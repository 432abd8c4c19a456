"""Which archived turns become search passages, and how far a session's index has got.

The keeper indexes a session's archive after every cut, and a migration rebuilds the index of
every session in its new home; both go through :func:`catch_up`, so an index built either way
holds the same passages at the same positions.

Each record's first passage position is kept beside it in the archive (``set_positions``): a
branch of a forked conversation is a set of records, and this is how its passages are found in
an index shared by every branch (``branches``). Records indexed before positions were kept get
theirs worked out again, once, the first time a branch needs them (:func:`ensure_positions`).
"""

from __future__ import annotations

import logging

from keeper_middleware.archive.records import ArchivedTurn
from keeper_middleware.archive.store import ArchiveStore, put_values
from keeper_middleware.retrievers.base import Passage, Retriever
from keeper_middleware.retrievers.passages import passages_of
from keeper_middleware.search.schema import SEARCH_TOOL_NAME

INDEXED_SEQ = "indexed_seq"
NEXT_POSITION = "next_position"
_BATCH = 2_000
_PAGE = 512

log = logging.getLogger(__name__)


def _indexed(turn: ArchivedTurn) -> bool:
    """Search results are archived (every turn is) but never indexed: a search must not find
    the results of earlier searches."""
    return bool(turn.content.strip()) and turn.name != SEARCH_TOOL_NAME


def catch_up(
    archive: ArchiveStore,
    session: str,
    retrievers: tuple[Retriever, ...],
    *,
    unit: str = "sentences",
) -> int:
    """Index the session's turns the retrievers have not seen yet, cut into passages as
    ``unit`` says (``KeeperConfig.passages``); returns passages added.

    Safe after a crash at any point: the positions and the progress are saved after the
    passages are added, and re-adding a passage at a position it already holds replaces it.
    """
    done = int(archive.get_value(session, INDEXED_SEQ) or -1)
    position = int(archive.get_value(session, NEXT_POSITION) or 0)
    added = 0
    batch: list[Passage] = []
    positions: list[tuple[int, int]] = []
    for turn in archive.turns(session, after_seq=done):
        positions.append((turn.seq, position))
        if _indexed(turn):
            passages = passages_of(unit, session, turn.item or 0, turn.content, position)
            position += len(passages)
            batch.extend(passages)
        done = turn.seq
        if len(batch) >= _BATCH:
            added += _add(retrievers, batch)
            batch = []
    added += _add(retrievers, batch)
    archive.set_positions(session, positions, {INDEXED_SEQ: done, NEXT_POSITION: position})
    return added


def _add(retrievers: tuple[Retriever, ...], batch: list[Passage]) -> int:
    if batch:
        for retriever in retrievers:
            retriever.add(batch)
    return len(batch)


def ensure_positions(
    archive: ArchiveStore,
    session: str,
    retrievers: tuple[Retriever, ...],
    *,
    unit: str = "sentences",
) -> None:
    """Give the records indexed before positions were kept (an archive of an earlier release)
    their positions: the passages they were cut into are counted again, as ``catch_up`` cut
    them. When the count does not come out where the index is (it was built with another
    ``unit``), the session's index is built again from the archive, positions and all."""
    done = int(archive.get_value(session, INDEXED_SEQ) or -1)
    if done < 0 or archive.positions(session, [0]).get(0) is not None:
        return
    position = 0
    positions: list[tuple[int, int]] = []
    known: int | None = None
    stored: dict[int, int | None] = {}
    for turn in archive.turns(session):
        if turn.seq > done:
            break
        if turn.seq not in stored:  # the stored positions are read a page at a time
            stored = archive.positions(session, range(turn.seq, turn.seq + _PAGE))
        known = stored.get(turn.seq)
        if known is not None:  # the first record indexed since positions are kept
            break
        positions.append((turn.seq, position))
        if _indexed(turn):
            position += len(passages_of(unit, session, turn.item or 0, turn.content, position))
    if known is None:
        known = int(archive.get_value(session, NEXT_POSITION) or 0)
    if known == position:
        archive.set_positions(session, positions)
        return
    log.warning(
        "session=%s: the search index was built with other passages than %r (%d counted, %d "
        "indexed); indexing the session again",
        session,
        unit,
        position,
        known,
    )
    for retriever in retrievers:
        retriever.delete_session(session)
    put_values(archive, session, {INDEXED_SEQ: -1, NEXT_POSITION: 0})
    catch_up(archive, session, retrievers, unit=unit)
