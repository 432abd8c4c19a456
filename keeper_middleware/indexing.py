"""Which archived turns become search passages, and how far a session's index has got.

The keeper indexes a session's archive after every cut, and a migration rebuilds the index of
every session in its new home; both go through :func:`catch_up`, so an index built either way
holds the same passages at the same positions.
"""

from __future__ import annotations

import logging

from keeper_middleware.archive.store import ArchiveStore, put_values
from keeper_middleware.retrievers.base import Passage, Retriever
from keeper_middleware.retrievers.passages import passages_of
from keeper_middleware.search.schema import SEARCH_TOOL_NAME

log = logging.getLogger(__name__)

INDEXED_SEQ = "indexed_seq"
NEXT_POSITION = "next_position"
_BATCH = 2_000


def catch_up(
    archive: ArchiveStore,
    session: str,
    retrievers: tuple[Retriever, ...],
    *,
    unit: str = "sentences",
) -> int:
    """Index the session's turns the retrievers have not seen yet, cut into passages as
    ``unit`` says (``KeeperConfig.passages``); returns passages added.

    Safe after a crash at any point: the progress is saved after the passages are added, and
    re-adding a passage at a position it already holds replaces it.
    """
    done = int(archive.get_value(session, INDEXED_SEQ) or -1)
    position = int(archive.get_value(session, NEXT_POSITION) or 0)
    added = 0
    batch: list[Passage] = []
    for turn in archive.turns(session, after_seq=done):
        # search results are archived (every turn is) but never indexed: a search must not
        # find the results of earlier searches
        if turn.content.strip() and turn.name != SEARCH_TOOL_NAME:
            passages = passages_of(unit, session, turn.item or 0, turn.content, position)
            position += len(passages)
            batch.extend(passages)
        done = turn.seq
        if len(batch) >= _BATCH:
            added += _add(retrievers, batch)
            batch = []
    added += _add(retrievers, batch)
    put_values(archive, session, {INDEXED_SEQ: done, NEXT_POSITION: position})
    return added


def reconcile(
    archive: ArchiveStore,
    session: str,
    retrievers: tuple[Retriever, ...],
    *,
    unit: str = "sentences",
) -> bool:
    """Rebuild a session's index when it holds passages the archive never indexed; True when
    it did.

    The archive records how many passages it has given the index (``NEXT_POSITION``); an index
    holding more belongs to turns the archive no longer has (the archive file was deleted or
    replaced by an older copy), and search would serve their text. Such an index is emptied for
    the session and built again from the archive. An index holding fewer is left as it is
    (a store that counts only what this process added cannot tell).
    """
    position = int(archive.get_value(session, NEXT_POSITION) or 0)
    stale = [r for r in retrievers if r.count(session) > position]
    if not stale:
        return False
    log.warning(
        "index rebuilt session=%s: it held passages beyond the %d the archive %r indexed "
        "(the archive was replaced or deleted since)",
        session,
        position,
        archive,
    )
    for retriever in retrievers:
        retriever.delete_session(session)
    put_values(archive, session, {INDEXED_SEQ: -1, NEXT_POSITION: 0})
    catch_up(archive, session, retrievers, unit=unit)
    return True


def _add(retrievers: tuple[Retriever, ...], batch: list[Passage]) -> int:
    if batch:
        for retriever in retrievers:
            retriever.add(batch)
    return len(batch)
