"""Context rot: a reader that notices less of what lies far back in a long context.

Real models read the end of a long context better than its middle and beginning, and read worse
as the context grows. Without that, keeping everything in a long live window would look free.
The simulated reader models it at the level of sentences: each sentence it is sent is overlooked
with a probability that grows with its distance (in tokens) from the end of the request,

    p = rate × min(1, distance / length)

so text within the last few thousand tokens is almost always seen, text ``length`` tokens back
or more is overlooked at ``rate``, and a longer context holds more far-away text. An overlooked
sentence is simply not there for that reply: a change never applied, a rule never followed, a
NOTES line never read.

The decision is a hash of (seed, the sentence, its place among equal sentences in the message)
compared with ``p``: the same sentence at the same distance is always overlooked or always seen,
raising ``rate`` or moving a sentence further back only adds to what is overlooked, and a run is
reproduced by its seed. Story heads ("Item N."), questions and the keeper's own requests are
never overlooked (they frame the reply rather than inform it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from langchain_core.messages import BaseMessage

from keeper_bench.reader.faults import unit_hash
from keeper_bench.reader.messages import message_kind
from keeper_bench.reader.pinned import PINNED_TAG, RULE_PREFIX, RULES_READ_SENTENCE
from keeper_bench.reader.text import BATCH_HEAD_WORD, TEXTS_REMEMBERED, is_questions_message
from keeper_middleware.messages.facts import text_of

_SENTENCE_END = re.compile(r"(?<=[.?!])[ \t]+|\n")
_HEAD = re.compile(rf"^\s*{BATCH_HEAD_WORD} \d+\.\s*$")
_NOTES_LINE = re.compile(r"^- ")
_PASSAGE_LINE = re.compile(r"^(?:[-*]\s+)?item \d+: ")
_PINNED_PROGRESS = re.compile(r"^Read up to item \d+\.")
_ROTTING_KINDS = frozenset({"input", "search_result", "file_result", "notes", "pinned"})
_GREP_LINE = re.compile(r"^\s+\d+: ")
_FILE_FRAME = re.compile(r'^(?:@@ .* @@|/\S*:|<message type="\w+">\s*$)')
_FILE_TAG = re.compile(r'^<message type="\w+">|</message>$')


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextRot:
    """How much the reader overlooks far back in its context (0: nothing, the default)."""

    rate: float = 0.0
    """The chance of overlooking a sentence ``length`` tokens or more from the end, in [0, 1]."""
    length: int = 100_000
    """The distance (tokens) at which the chance reaches ``rate``; it grows linearly up to it."""
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.rate, bool) or not isinstance(self.rate, int | float):
            raise ValueError(f"ContextRot.rate must be a number in [0, 1], got {self.rate!r}.")
        if not 0 <= self.rate <= 1:
            raise ValueError(
                f"ContextRot.rate must be between 0 and 1, got {self.rate}; use 0 to switch "
                "context rot off."
            )
        if isinstance(self.length, bool) or not isinstance(self.length, int) or self.length < 1:
            raise ValueError(
                f"ContextRot.length must be a positive number of tokens, got {self.length!r}."
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"ContextRot.seed must be an int, got {self.seed!r}.")

    def chance(self, distance: int) -> float:
        """The chance of overlooking a sentence ``distance`` tokens from the end."""
        return self.rate * min(1.0, max(0, distance) / self.length)

    def overlooks(self, sentence: str, occurrence: int, distance: int) -> bool:
        chance = self.chance(distance)
        if chance <= 0.0:
            return False
        return unit_hash(self.seed, f"rot/{occurrence}", sentence) < chance


NO_ROT = ContextRot()
REALISTIC_ROT = ContextRot(rate=0.25, length=100_000)
"""A stated setting, not a measurement: a quarter of what lies 100K tokens back is overlooked,
an eighth at 50K, under a tenth of what a 32K-token window holds at its far end."""


def _tokens(chars: int) -> int:
    return (chars + 3) // 4


def _pieces(text: str, kind: str) -> list[tuple[int, str]]:
    """(start, piece) for the units that can be overlooked: sentences, or whole item-tagged and
    NOTES lines (a line of a search result or a NOTES block stands or falls as one)."""
    pieces: list[tuple[int, str]] = []
    line_start = 0
    for line in text.split("\n"):
        stripped = line.strip()
        whole = kind in ("notes", "search_result", "pinned") or stripped.startswith(("item ", "- "))
        whole = whole or (kind == "file_result" and _GREP_LINE.match(line) is not None)
        if whole:
            pieces.append((line_start, line))
        else:
            position = 0
            for part in _SENTENCE_END.split(line):
                start = line.find(part, position)
                pieces.append((line_start + start, part))
                position = start + len(part)
        line_start += len(line) + 1
    return pieces


def _can_rot(piece: str, kind: str, *, rules_read: bool = False) -> bool:
    stripped = piece.strip()
    if not stripped or _HEAD.match(stripped):
        return False
    if kind == "pinned":
        # its tag and instructions frame the reply; RULE: lines the instructions say to read
        # before answering are read at the point of use, so distance does not hide them
        if stripped.startswith(PINNED_TAG) or _PINNED_PROGRESS.match(stripped):
            return False
        return not (rules_read and stripped.startswith(RULE_PREFIX))
    if kind == "notes":
        return _NOTES_LINE.match(stripped) is not None
    if kind == "search_result":
        return _PASSAGE_LINE.match(stripped) is not None
    if kind == "file_result":
        # a grep match line rots whole, a line read sentence by sentence, as search results
        # and batches do; the read's line range, the file's name and batch heads frame it
        if _FILE_FRAME.match(stripped):
            return False
        return not _HEAD.match(_FILE_TAG.sub("", stripped))
    return True


def rotted_text(text: str, kind: str, after: int, rot: ContextRot) -> str:
    """``text`` without the pieces overlooked, ``after`` tokens following it in the request."""
    if kind not in _ROTTING_KINDS or is_questions_message(text):
        return text
    kept: list[str] = []
    cursor = 0
    for start, size, draw in _rot_plan(text, kind, rot.seed):
        distance = after + _tokens(len(text) - start)
        kept.append(text[cursor:start])
        if draw is None or not _overlooked(draw, rot.chance(distance)):
            kept.append(text[start : start + size])
        cursor = start + size
    kept.append(text[cursor:])
    return "".join(kept)


def _overlooked(draw: float, chance: float) -> bool:
    """:meth:`ContextRot.overlooks` for a piece whose hash is ``draw``."""
    return chance > 0.0 and draw < chance


@lru_cache(maxsize=TEXTS_REMEMBERED)
def _rot_plan(text: str, kind: str, seed: int) -> tuple[tuple[int, int, float | None], ...]:
    """(start, length, hash) of each piece of ``text``; the hash is None for a piece that never
    rots. Only the distance changes from one request to the next, so the pieces and their
    hashes are worked out once per text."""
    plan: list[tuple[int, int, float | None]] = []
    seen: dict[str, int] = {}
    rules_read = kind == "pinned" and RULES_READ_SENTENCE in text
    for start, piece in _pieces(text, kind):
        occurrence = seen.get(piece, 0)
        seen[piece] = occurrence + 1
        can_rot = _can_rot(piece, kind, rules_read=rules_read)
        draw = unit_hash(seed, f"rot/{occurrence}", piece) if can_rot else None
        plan.append((start, len(piece), draw))
    return tuple(plan)


def with_rot(messages: Sequence[BaseMessage], rot: ContextRot) -> list[BaseMessage]:
    """The messages as a reader with context rot takes them in (new messages; none changed)."""
    if rot.rate <= 0.0:
        return list(messages)
    seen: list[BaseMessage] = []
    after = 0
    for message in reversed(messages):
        text = text_of(message)
        kind = message_kind(message)
        rotted = rotted_text(text, kind, after, rot)
        after += _tokens(len(text))
        seen.append(message if rotted == text else message.model_copy(update={"content": rotted}))
    return list(reversed(seen))
