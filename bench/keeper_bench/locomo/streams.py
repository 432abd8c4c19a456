"""The benchmark's own counter streams measured like LoCoMo: each batch a turn, each question with
its answer's item as evidence.

LoCoMo's turns are short messages; the streams' batches are long stories (about a hundred
sentences, three of which change counters). A choice of passages that wins on one and loses on
the other is no default, so ``keeper-bench locomo recall --stream`` measures both with the same
methods. A batch is archived as the keeper archives it (its text alone, no speaker or date), and a
question only searches the items before it was asked, as an agent's archive search would.
"""

from __future__ import annotations

import re
from pathlib import Path

from keeper_bench.locomo.dataset import Conversation, Question, Session, Turn
from keeper_bench.streams import read_stream

_QUESTION_LINE = re.compile(r"^(\d+)\.\s+(.*\S)\s*$")


def conversation_from_stream(folder: Path | str, *, name: str = "") -> Conversation:
    """The stream as a conversation: item N is session N with one turn ``DN:1`` (the batch), and
    each question whose answer stands in an item has that item's turn as evidence."""
    sessions: list[Session] = []
    questions: list[Question] = []
    for record in read_stream(folder):
        if record["type"] == "batch":
            item = int(record["item"])
            turn = Turn(dia_id=f"D{item}:1", session=item, speaker="", text=str(record["text"]))
            sessions.append(Session(number=item, date="", turns=(turn,)))
            continue
        if record["type"] != "questions":
            continue
        texts = _question_lines(str(record["text"]))
        for asked in record["questions"]:
            item = asked.get("item")
            text = texts.get(int(asked["number"]))
            if item is None or text is None or asked["category"] == "unknown":
                continue  # no item holds the answer
            questions.append(
                Question(
                    question=text,
                    answer=str(asked["answer"]),
                    category=4,
                    evidence=(f"D{int(item)}:1",),
                    asked_after=int(record["after_item"]),
                    kind=str(asked["category"]),
                )
            )
    return Conversation(
        sample_id=name or Path(folder).name,
        speakers=("", ""),
        sessions=tuple(sessions),
        questions=tuple(questions),
    )


def _question_lines(text: str) -> dict[int, str]:
    found: dict[int, str] = {}
    for line in text.splitlines():
        match = _QUESTION_LINE.match(line)
        if match:
            found[int(match.group(1))] = match.group(2)
    return found
