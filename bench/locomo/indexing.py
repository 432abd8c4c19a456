"""A conversation as the passages an archive indexes, and the turn each passage came from.

Three ways to cut a turn, so the benchmark can compare them on the same conversation:

- ``sentences``: the turn archived as ``Speaker (date): text`` and cut into sentence passages
  (the first form: the speaker and the date reach only the first sentence);
- ``sentences+context``: the same sentences, each carrying ``Speaker (date)`` as its context;
- ``messages``: the whole turn (chunked when long) as one passage carrying its context.

Sessions are items (their number), so item filters and result lines count in sessions.
"""

from __future__ import annotations

from dataclasses import dataclass

from keeper_middleware.bench.locomo.dataset import Conversation, archived_text
from keeper_middleware.retrievers.base import Passage
from keeper_middleware.retrievers.passages import passages_from_message
from keeper_middleware.retrievers.sentences import passages_from_text

GRANULARITIES = ("messages", "sentences+context", "sentences")


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
            if granularity == "sentences":
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


def whole_turns(conversation: Conversation) -> tuple[list[str], list[str]]:
    """The baselines' corpus: each turn archived whole, and its ``dia_id``."""
    texts: list[str] = []
    ids: list[str] = []
    for part in conversation.sessions:
        for turn in part.turns:
            texts.append(archived_text(turn, part.date))
            ids.append(turn.dia_id)
    return texts, ids
