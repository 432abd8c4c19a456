"""Scoring answers: normalise, match to questions, aggregate by question type and by distance.

Pure: the questions come from a stream's question records, the answers from a reply's numbered
lines. An answer counts only when it commits to one value: a hedged ("I think it's 12"), negated
("57, not overdrawn") or multi-valued ("12 or protected") answer is wrong whatever it contains,
because a grader that looks for the right word inside such an answer rewards a reader for listing
every candidate. Every result carries a ``reader`` label ("simulated reader" or a model's name) that is
printed in every table header, so a simulated result is never mistaken for a model's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from keeper_bench.phrasing import OVERDRAWN, PROTECTED, UNKNOWN
from keeper_bench.questions import BUCKET_LABELS, CATEGORIES
from keeper_middleware.notes.numbers import amounts_in, parse_number

SIMULATED_READER = "simulated reader"
_KEYWORDS = (PROTECTED, OVERDRAWN, UNKNOWN)
_ANSWER_LINE = re.compile(r"^\s*[*_#>\s-]*(\d+)\s*[.):]\**\s*(.*?)\s*$")
_LEAD_IN = re.compile(
    r"^(?:the\s+)?(?:final\s+)?answer\s*(?:is|:)\s*|^(?:it\s+(?:is|was)|value\s*[:=])\s*",
    re.IGNORECASE,
)


def normalize_answer(text: str) -> str:
    """One canonical form per meaning: "1,204" → "1204", "minus six" → "-6", "Protected." → "protected".

    Actor names compare case-insensitively with spaces collapsed; a lone keyword wins over the
    words around it ("The value is protected." → "protected").
    """
    cleaned = text.strip().strip("*_`\"'").strip()
    cleaned = _LEAD_IN.sub("", cleaned).strip()
    cleaned = re.sub(r"[\s.,;:!?]+$", "", cleaned).strip("*_`\"' ")
    lowered = " ".join(cleaned.lower().split())
    number = parse_number(lowered)
    if number is not None and number.is_integer():
        return str(int(number))
    words = set(re.findall(r"[a-z]+", lowered))
    found = [k for k in _KEYWORDS if k in words]
    if len(found) == 1 and len(words) <= 6:
        return found[0]
    return lowered


_WORKING = re.compile(r"\s*\(\s*=[^()]*\)\s*[.]?\s*$")
_HEDGES = frozenset(
    [
        "think",
        "thinks",
        "guess",
        "maybe",
        "perhaps",
        "probably",
        "possibly",
        "likely",
        "unlikely",
        "seems",
        "seem",
        "appears",
        "might",
        "could",
        "unsure",
        "uncertain",
        "approximately",
        "roughly",
        "around",
        "presumably",
        "believe",
        "suppose",
        "assume",
        "assuming",
    ]
)
_HEDGE_PHRASES = ("not sure", "if i recall", "as far as", "i'd say", "i would say")
_NEGATIONS = frozenset(
    ["not", "no", "never", "neither", "nor", "none", "cannot", "isn't", "wasn't", "aren't"]
)
_ALTERNATIVES = frozenset({"or", "either", "and/or"})


def without_working(text: str) -> str:
    """The answer without a trailing working in the notes' form: "58 (= 9 * 5 + 13)" → "58"."""
    return _WORKING.sub("", text)


def answer_problem(text: str) -> str | None:
    """Why an answer commits to no single value, or None when it does.

    "hedged": it says it is unsure ("I think", "maybe", "probably"); "negated": it says what the
    value is not ("57, not overdrawn", "never recorded"); "several values": it names more than
    one candidate (two amounts, an amount and a keyword, two keywords, or an "or"). A trailing
    working in the notes' form, "58 (= 9 * 5 + 13)", is part of one answer, not a second value.
    """
    lowered = " ".join(without_working(text).lower().replace("’", "'").split())
    words = re.findall(r"[a-z]+(?:'[a-z]+)?|and/or", lowered)
    if any(word in _HEDGES for word in words) or any(p in lowered for p in _HEDGE_PHRASES):
        return "hedged"
    if any(word in _NEGATIONS or word.endswith("n't") for word in words):
        return "negated"
    keywords = {word for word in words if word in _KEYWORDS}
    if len(amounts_in(lowered)) + len(keywords) > 1 or any(w in _ALTERNATIVES for w in words):
        return "several values"
    return None


def answers_match(expected: str, given: str) -> bool:
    """Whether ``given`` commits to the one value ``expected`` (see :func:`answer_problem`)."""
    if answer_problem(given) is not None:
        return False
    left, right = normalize_answer(expected), normalize_answer(without_working(given))
    if left == right:
        return True
    # "the clerk" and "clerk" are the same actor
    return left.removeprefix("the ") == right.removeprefix("the ") and bool(left)


def parse_answer_lines(reply: str) -> dict[int, str]:
    """The "N. answer" lines of a reply; the first line for each number counts."""
    answers: dict[int, str] = {}
    for line in reply.splitlines():
        match = _ANSWER_LINE.match(line)
        if match and match.group(2):
            answers.setdefault(int(match.group(1)), match.group(2))
    return answers


@dataclass(frozen=True, slots=True)
class ScoredQuestion:
    after_item: int
    final: bool
    number: int
    category: str
    bucket: str
    expected: str
    given: str | None
    right: bool


@dataclass(frozen=True, slots=True)
class GradeResult:
    reader: str
    label: str
    scored: tuple[ScoredQuestion, ...]
    by_category: dict[str, tuple[int, int]] = field(default_factory=dict)
    by_bucket: dict[str, tuple[int, int]] = field(default_factory=dict)
    """(right, asked) per key, in a fixed order; keys with no questions are left out."""

    @property
    def right(self) -> int:
        return sum(q.right for q in self.scored)

    @property
    def asked(self) -> int:
        return len(self.scored)

    @property
    def sets(self) -> int:
        """How many question sets were asked."""
        return len({(q.after_item, q.final) for q in self.scored})

    @property
    def lost_sets(self) -> tuple[int, int]:
        """Question sets whose reply answered none of their questions (an empty or cut-off
        reply that stood, or no reply), and how many questions they held: a harness's loss,
        told apart from what a memory got wrong (``memory_errors``)."""
        given: dict[tuple[int, bool], list[bool]] = {}
        for q in self.scored:
            given.setdefault((q.after_item, q.final), []).append(q.given is not None)
        lost = [len(flags) for flags in given.values() if not any(flags)]
        return len(lost), sum(lost)

    @property
    def memory_errors(self) -> int:
        """Questions answered wrong (or left out) in the sets whose reply answered something."""
        return self.asked - self.right - self.lost_sets[1]

    def to_json(self) -> dict[str, Any]:
        return {
            "reader": self.reader,
            "label": self.label,
            "right": self.right,
            "asked": self.asked,
            "by_category": {k: list(v) for k, v in self.by_category.items()},
            "by_bucket": {k: list(v) for k, v in self.by_bucket.items()},
            "scored": [
                {
                    "after_item": q.after_item,
                    "final": q.final,
                    "number": q.number,
                    "category": q.category,
                    "bucket": q.bucket,
                    "expected": q.expected,
                    "given": q.given,
                    "right": q.right,
                }
                for q in self.scored
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GradeResult:
        return cls(
            reader=data["reader"],
            label=data["label"],
            scored=tuple(ScoredQuestion(**q) for q in data["scored"]),
            by_category={k: (v[0], v[1]) for k, v in data["by_category"].items()},
            by_bucket={k: (v[0], v[1]) for k, v in data["by_bucket"].items()},
        )

    def markdown(self) -> str:
        return grade_markdown(self)


def grade(
    question_sets: Iterable[Mapping[str, Any]],
    replies: Mapping[tuple[int, bool], str],
    *,
    reader: str,
    label: str = "",
) -> GradeResult:
    """Score every question of every set; a set with no reply scores all its questions wrong.

    ``question_sets`` are the stream's "questions" records; ``replies`` maps (after_item, final)
    to the reply text that answered that set.
    """
    if not reader.strip():
        raise ValueError('reader must name who answered: "simulated reader" or the model name')
    scored: list[ScoredQuestion] = []
    for record in question_sets:
        key = (int(record["after_item"]), bool(record["final"]))
        answers = parse_answer_lines(replies.get(key, ""))
        for question in record["questions"]:
            given = answers.get(int(question["number"]))
            expected = str(question["answer"])
            scored.append(
                ScoredQuestion(
                    after_item=key[0],
                    final=key[1],
                    number=int(question["number"]),
                    category=str(question["category"]),
                    bucket=str(question["bucket"]),
                    expected=expected,
                    given=given,
                    right=given is not None and answers_match(expected, given),
                )
            )
    return GradeResult(
        reader=reader,
        label=label,
        scored=tuple(scored),
        by_category=_tally(scored, "category", CATEGORIES),
        by_bucket=_tally(scored, "bucket", BUCKET_LABELS),
    )


def _tally(
    scored: Sequence[ScoredQuestion], key: str, order: Sequence[str]
) -> dict[str, tuple[int, int]]:
    counts: dict[str, list[int]] = {}
    for question in scored:
        bucket = counts.setdefault(getattr(question, key), [0, 0])
        bucket[0] += question.right
        bucket[1] += 1
    ordered = [k for k in order if k in counts] + sorted(k for k in counts if k not in order)
    return {k: (counts[k][0], counts[k][1]) for k in ordered}


def _cell(right: int, asked: int) -> str:
    return f"{right}/{asked}" if asked else "–"


def grade_markdown(result: GradeResult) -> str:
    title = f"Score ({result.reader}{', ' + result.label if result.label else ''})"
    lines = [f"### {title}: {result.right}/{result.asked}", ""]
    lines += ["| question type | right/asked |", "| --- | --- |"]
    lines += [f"| {k} | {_cell(*v)} |" for k, v in result.by_category.items()]
    lines += ["", f"| distance back (batches) — {result.reader} | right/asked |", "| --- | --- |"]
    lines += [f"| {k} | {_cell(*v)} |" for k, v in result.by_bucket.items()]
    return "\n".join(lines) + "\n"
