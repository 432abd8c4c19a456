"""Which archived turns become search passages, and how far a session's index has got.

The keeper indexes a session's archive after every cut, and a migration rebuilds the index of
every session in its new home; both go through :func:`catch_up`, so an index built either way
holds the same passages at the same positions.
"""

from __future__ import annotations

from keeper_middleware.archive.store import ArchiveStore, put_values
from keeper_middleware.retrievers.base import Passage, Retriever
from keeper_middleware.retrievers.passages import passages_of
from keeper_middleware.search.schema import SEARCH_TOOL_NAME

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


def _add(retrievers: tuple[Retriever, ...], batch: list[Passage]) -> int:
    if batch:
        for retriever in retrievers:
            retriever.add(batch)
    return len(batch)
