"""A conversation as the passages an archive indexes, and the turn each passage came from.

Ways to cut a turn, so the benchmark can compare them on the same conversation:

- ``keeper`` (the default): what the keeper itself indexes. Each turn is archived as a user
  message ``Speaker (date): text`` in its session's item and cut by the product's own
  :func:`~keeper_middleware.search.indexing.turn_passages` with ``KeeperConfig``'s default unit, every
  passage carrying the context the keeper derives (speaker, date, item);
- ``keeper-sentences`` / ``keeper-messages``: the same, with that passage unit;
- ``sentences``: the turn archived as ``Speaker (date): text`` and cut into sentence passages
  with no context (the first form: the speaker and the date reach only the first sentence);
- ``sentences+context``: the same sentences, each carrying ``Speaker (date)`` as its context;
- ``messages``: the turn's words alone (chunked when long) as one passage carrying
  ``Speaker (date)``.

Sessions are items (their number), so item filters and result lines count in sessions.
"""

from __future__ import annotations

from dataclasses import dataclass

from keeper_bench.locomo.dataset import Conversation, Session, Turn, archived_text
from keeper_middleware.archive.records import ArchivedTurn
from keeper_middleware.config import KeeperConfig
from keeper_middleware.retrievers.base import Passage
from keeper_middleware.retrievers.passages import passages_from_message
from keeper_middleware.retrievers.sentences import passages_from_text
from keeper_middleware.search.indexing import turn_passages

GRANULARITIES = (
    "keeper",
    "keeper-sentences",
    "keeper-messages",
    "messages",
    "sentences+context",
    "sentences",
)


@dataclass(frozen=True, slots=True)
class IndexedConversation:
    passages: tuple[Passage, ...]
    turn_of: dict[int, str]
    """``dia_id`` of the turn each passage position came from."""
    turns: int


def conversation_passages(
    conversation: Conversation, *, session: str, granularity: str
) -> IndexedConversation:
    if granularity not in GRANULARITIES:
        raise ValueError(
            f"granularity must be one of {', '.join(GRANULARITIES)}, got {granularity!r}."
        )
    passages: list[Passage] = []
    turn_of: dict[int, str] = {}
    turns = 0
    for part in conversation.sessions:
        for turn in part.turns:
            turns += 1
            position = len(passages)
            context = f"{turn.speaker} ({part.date})" if turn.speaker else ""
            if granularity.startswith("keeper"):
                made = turn_passages(
                    archived_turn(turn, part, session), keeper_unit(granularity), position
                )
            elif granularity == "sentences":
                made = passages_from_text(
                    session, part.number, archived_text(turn, part.date), position
                )
            elif granularity == "sentences+context":
                made = [
                    Passage(
                        session=p.session,
                        item=p.item,
                        position=p.position,
                        text=p.text,
                        context=context,
                    )
                    for p in passages_from_text(session, part.number, turn.message(), position)
                ]
            else:
                made = passages_from_message(
                    session, part.number, turn.message(), position, context=context
                )
            for passage in made:
                turn_of[passage.position] = turn.dia_id
            passages.extend(made)
    return IndexedConversation(tuple(passages), turn_of, turns)


def keeper_unit(granularity: str) -> str:
    """The passage unit of a ``keeper`` granularity (the product's default for ``keeper``)."""
    _, _, unit = granularity.partition("-")
    return unit or KeeperConfig().passages


def archived_turn(turn: Turn, part: Session, session: str) -> ArchivedTurn:
    """The turn as the keeper archives a message of a transcript: a user message in its
    session's item, its speaker and date in front."""
    return ArchivedTurn(
        session=session,
        msg_id=turn.dia_id,
        item=part.number,
        role="human",
        content=archived_text(turn, part.date),
    )


def whole_turns(conversation: Conversation) -> tuple[list[str], list[str]]:
    """The baselines' corpus: each turn archived whole, and its ``dia_id``."""
    texts: list[str] = []
    ids: list[str] = []
    for part in conversation.sessions:
        for turn in part.turns:
            texts.append(archived_text(turn, part.date))
            ids.append(turn.dia_id)
    return texts, ids
