"""Reads LoCoMo's JSON file (a path the user gives; the dataset is never downloaded or bundled).

The file is a list of samples. Each holds ``conversation`` (``speaker_a``, ``speaker_b``, and
``session_N`` lists of turns with ``speaker``, ``dia_id``, ``text`` and optionally
``blip_caption`` for a shared photo, beside ``session_N_date_time``) and ``qa`` (``question``,
``answer`` or ``adversarial_answer``, ``category`` 1–5, ``evidence``: the ``dia_id`` of each turn
that holds the answer). Evidence ids are sometimes written several to one string
("D8:6; D9:17"), so they are split here once.

A conversation becomes a stream the arms can run: each session is one item (its number), with its
date kept, and each turn is archived as ``Speaker (date): text``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

CATEGORIES = {
    1: "multi-hop",
    2: "temporal",
    3: "open-domain",
    4: "single-hop",
    5: "adversarial",
}
"""LoCoMo's question categories, as the released file numbers them."""

_SESSION_KEY = re.compile(r"^session_(\d+)$")
_DIA_ID = re.compile(r"D(\d+):(\d+)")


class LocomoFormatError(ValueError):
    """The file is not in LoCoMo's format; the message says where and what was expected."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Turn:
    """One message of the conversation."""

    dia_id: str
    session: int
    speaker: str
    text: str
    caption: str = ""
    """What a shared photo shows (the dataset's ``blip_caption``), or ""."""

    def message(self) -> str:
        """The message as a chat client would hand it on: the text, and the photo if one came."""
        if not self.caption:
            return self.text
        return f"{self.text} [shares a photo: {self.caption}]"


@dataclass(frozen=True, slots=True, kw_only=True)
class Session:
    number: int
    date: str
    turns: tuple[Turn, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Question:
    question: str
    answer: str
    """The annotated answer; for category 5 (the conversation does not hold it) the adversarial
    answer a model might wrongly give."""
    category: int
    evidence: tuple[str, ...]
    asked_after: int | None = None
    """The last session (item) before the question was asked, when it was asked mid-way (the
    benchmark's streams); None: after the whole conversation."""
    kind: str = ""
    """A finer label than the category, when the source has one (the streams' question kinds)."""

    @property
    def adversarial(self) -> bool:
        return self.category == 5


@dataclass(frozen=True, slots=True, kw_only=True)
class Conversation:
    sample_id: str
    speakers: tuple[str, str]
    sessions: tuple[Session, ...]
    questions: tuple[Question, ...]

    def turns(self) -> Iterator[Turn]:
        for session in self.sessions:
            yield from session.turns

    def session_date(self, number: int) -> str:
        return next(s.date for s in self.sessions if s.number == number)


def archived_text(turn: Turn, date: str) -> str:
    """How a turn is archived: ``Speaker (date): message`` (the message alone without a
    speaker)."""
    return f"{turn.speaker} ({date}): {turn.message()}" if turn.speaker else turn.message()


def split_evidence(raw: Any) -> tuple[str, ...]:
    """Every ``D<session>:<turn>`` id in the evidence list, however the ids were separated."""
    if raw is None:
        return ()
    values = raw if isinstance(raw, list) else [raw]
    found: list[str] = []
    for value in values:
        for session, turn in _DIA_ID.findall(str(value)):
            dia_id = f"D{int(session)}:{int(turn)}"
            if dia_id not in found:
                found.append(dia_id)
    return tuple(found)


def load_locomo(path: str | PathLike[str]) -> list[Conversation]:
    """Every conversation in a LoCoMo file, or a ``LocomoFormatError`` naming what is wrong."""
    source = Path(path)
    if not source.is_file():
        raise FileNotFoundError(
            f"No LoCoMo file at {source}: pass the path of the dataset's JSON file "
            "(e.g. locomo10.json)."
        )
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise LocomoFormatError(f"{source} is not JSON ({error}).") from error
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not data:
        raise LocomoFormatError(f"{source} must hold a list of samples (LoCoMo's format).")
    return [parse_sample(sample, where=f"{source} sample {i}") for i, sample in enumerate(data)]


def parse_sample(sample: Any, *, where: str = "sample") -> Conversation:
    if not isinstance(sample, Mapping):
        raise LocomoFormatError(f"{where}: expected an object with 'conversation' and 'qa'.")
    conversation = sample.get("conversation")
    if not isinstance(conversation, Mapping):
        raise LocomoFormatError(f"{where}: 'conversation' is missing or not an object.")
    sessions = _sessions(conversation, where)
    if not sessions:
        raise LocomoFormatError(f"{where}: the conversation has no session_N lists of turns.")
    known = {t.dia_id for s in sessions for t in s.turns}
    questions = tuple(
        _question(q, f"{where} qa {i}", known) for i, q in enumerate(sample.get("qa") or [])
    )
    return Conversation(
        sample_id=str(sample.get("sample_id", where)),
        speakers=(str(conversation.get("speaker_a", "")), str(conversation.get("speaker_b", ""))),
        sessions=sessions,
        questions=questions,
    )


def _sessions(conversation: Mapping[str, Any], where: str) -> tuple[Session, ...]:
    sessions: list[Session] = []
    for key, turns in conversation.items():
        match = _SESSION_KEY.match(key)
        if match is None or not turns:
            continue
        number = int(match.group(1))
        if not isinstance(turns, list):
            raise LocomoFormatError(f"{where}: {key} must be a list of turns.")
        date = str(conversation.get(f"{key}_date_time", "")).strip()
        parsed = tuple(_turn(t, number, f"{where} {key} turn {i}") for i, t in enumerate(turns))
        sessions.append(Session(number=number, date=date or f"session {number}", turns=parsed))
    return tuple(sorted(sessions, key=lambda s: s.number))


def _turn(raw: Any, session: int, where: str) -> Turn:
    if not isinstance(raw, Mapping):
        raise LocomoFormatError(f"{where}: a turn must be an object.")
    missing = [key for key in ("speaker", "dia_id", "text") if key not in raw]
    if missing:
        raise LocomoFormatError(f"{where}: the turn has no {', '.join(missing)}.")
    ids = split_evidence(raw["dia_id"])
    if len(ids) != 1:
        raise LocomoFormatError(f"{where}: dia_id {raw['dia_id']!r} is not like 'D1:3'.")
    caption = raw.get("blip_caption") or ""
    return Turn(
        dia_id=ids[0],
        session=session,
        speaker=str(raw["speaker"]),
        text=str(raw["text"]),
        caption=str(caption[0] if isinstance(caption, list) and caption else caption),
    )


def _question(raw: Any, where: str, known: set[str]) -> Question:
    if not isinstance(raw, Mapping) or "question" not in raw:
        raise LocomoFormatError(f"{where}: a qa entry needs a 'question'.")
    category = raw.get("category")
    if isinstance(category, bool) or not isinstance(category, int) or category not in CATEGORIES:
        raise LocomoFormatError(f"{where}: category must be 1–5, got {category!r}.")
    answer = raw.get("answer", raw.get("adversarial_answer", ""))
    evidence = tuple(e for e in split_evidence(raw.get("evidence")) if e in known)
    return Question(
        question=str(raw["question"]),
        answer=str(answer),
        category=category,
        evidence=evidence,
    )
