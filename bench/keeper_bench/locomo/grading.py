"""Grades answers to LoCoMo's questions the way the dataset's paper does (its evaluation code).

- Every answer and reference is normalised (lowercase; commas, punctuation and the words a, an,
  the, and removed; whitespace collapsed) and its words Porter-stemmed; the score is the token F1.
- Category 1 (multi-hop) answers list several things: both sides are split on commas, and the
  score is the mean over the reference parts of the best F1 any answer part reaches.
- Category 3 references keep only what comes before the first ";".
- Category 5 (the conversation does not hold the answer) counts 1 when the answer says so
  ("no information available" or "not mentioned"), else 0.
"""

from __future__ import annotations

import functools
import re
import string
from collections import Counter
from collections.abc import Callable

REFUSAL_MARKERS = ("no information available", "not mentioned")
"""What the paper's grader looks for in an answer to a question the conversation cannot answer."""

REFUSAL = "Not mentioned in the conversation"
"""What the task tells a model to write when the conversation does not say."""

_ARTICLES = re.compile(r"\b(a|an|the|and)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    text = text.replace(",", "").lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def token_f1(prediction: str, reference: str) -> float:
    stem = _stemmer()
    predicted = [stem(w) for w in normalize_answer(prediction).split()]
    wanted = [stem(w) for w in normalize_answer(reference).split()]
    common = Counter(predicted) & Counter(wanted)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(predicted)
    recall = same / len(wanted)
    return 2 * precision * recall / (precision + recall)


def multi_hop_f1(prediction: str, reference: str) -> float:
    answers = [p.strip() for p in prediction.split(",")]
    parts = [r.strip() for r in reference.split(",")]
    return sum(max(token_f1(a, part) for a in answers) for part in parts) / len(parts)


def is_refusal(prediction: str) -> bool:
    lowered = prediction.lower()
    return any(marker in lowered for marker in REFUSAL_MARKERS)


def grade_answer(prediction: str, reference: str, category: int) -> float:
    """The paper's score of one answer to a question of ``category`` (1–5)."""
    if category == 5:
        return 1.0 if is_refusal(prediction) else 0.0
    if category == 3:
        reference = reference.split(";")[0].strip()
    if category == 1:
        return multi_hop_f1(prediction, reference)
    return token_f1(prediction, reference)


@functools.cache
def _stemmer() -> Callable[[str], str]:
    try:
        from nltk.stem import PorterStemmer
    except ImportError as error:
        raise ImportError(
            "Grading LoCoMo answers as its paper does needs nltk's Porter stemmer: "
            "pip install keeper-bench"
        ) from error
    return PorterStemmer().stem  # type: ignore[no-any-return]
