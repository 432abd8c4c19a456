"""What the embedding side is asked: the question as written or reworded, as benchmark options.

Every passage the keeper indexes is embedded with its context (``Caroline (8 May, 2023), item
3: …``), so a question that names a speaker is near every turn of that speaker whatever it says,
and a question's scaffolding ("When did … ?", "What is …") is near no answer. Options, each
applied to the embedding backend (and the hybrid's embedding side) only:

- ``qstrip``: the question without its leading question words (``When did Caroline go to the
  support group?`` → ``Caroline go to the support group``);
- ``qnonames``: the question without the speakers it names (read from the contexts added, as an
  index knows them);
- ``mq`` / ``mqmax``: two searches, the question and the question without the names, fused by
  reciprocal rank (``mq``) or each passage at the better of its two cosine scores (``mqmax``);
  a question that names no speaker is searched once;
- ``mqstrip``: the same with the question's scaffolding also taken from the second query.

Measured in ``bench/results/locomo_recall_round13.md``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from keeper_bench.locomo.wrapping import WrappedRetriever
from keeper_middleware.retrievers.base import Hit, Passage, Retriever, Spans, search_within
from keeper_middleware.retrievers.hybrid import reciprocal_rank_fusion
from keeper_middleware.retrievers.named_context import ROLES, speaker_of

QUERY_FORMS = ("qstrip", "qnonames", "mq", "mqmax", "mqstrip")

_SCAFFOLD = re.compile(
    r"^\s*(?:(?:and|so|then)\s+)?"
    r"(?:when|what|where|who|whom|whose|which|why|how(?:\s+(?:many|much|long|often|old|far))?)"
    r"(?:\s+(?:kind|kinds|type|types|sort)\s+of)?"
    r"(?:\s+(?:did|does|do|is|are|was|were|has|have|had|will|would|could|can|might|should))?\b\s*",
    re.IGNORECASE,
)


def strip_scaffolding(question: str) -> str:
    """The question without its leading question words and final question mark; the question
    itself when nothing would be left."""
    stripped = _SCAFFOLD.sub("", question, count=1).strip().rstrip("?").strip()
    return stripped or question


def without_names(question: str, names: Sequence[str]) -> str:
    """The question with each of ``names`` (and its possessive) taken out, spaces tidied."""
    text = question
    for name in names:
        text = re.sub(rf"\b{re.escape(name)}(?:'s|’s)?\b", " ", text)
    text = re.sub(r"\s+", " ", text).strip()
    text = re.sub(r"\s+([?.,!])", r"\1", text)
    return text if re.search(r"\w", text) else question


def max_score_fusion(lists: Sequence[Sequence[Hit]], *, k: int) -> list[Hit]:
    """Each passage at the best score any list gave it (scores of one backend, comparable)."""
    best: dict[int, Hit] = {}
    for ranked in lists:
        for hit in ranked:
            position = hit.passage.position
            if position not in best or hit.score > best[position].score:
                best[position] = hit
    order = sorted(best.values(), key=lambda h: (-h.score, -h.passage.position))
    return order[:k]


class QueryFormRetriever(WrappedRetriever):
    """Wraps an embedding retriever; asks it the question in ``form`` (``QUERY_FORMS``)."""

    def __init__(self, inner: Retriever, *, form: str) -> None:
        if form not in QUERY_FORMS:
            raise ValueError(f"Unknown query form {form!r}: one of {', '.join(QUERY_FORMS)}.")
        super().__init__(inner)
        self._form = form
        self._speakers: set[str] = set()

    def add(self, passages: Sequence[Passage]) -> None:
        for passage in passages:
            who = speaker_of(passage.context)
            if who and who.lower() not in ROLES:
                self._speakers.add(who)
        self._inner.add(passages)

    def queries(self, query: str) -> list[str]:
        """The queries the form asks, the first the main one."""
        named = [s for s in sorted(self._speakers) if re.search(rf"\b{re.escape(s)}\b", query)]
        if self._form == "qstrip":
            return [strip_scaffolding(query)]
        second = without_names(query, named)
        if self._form == "qnonames":
            return [second]
        if self._form == "mqstrip":
            second = strip_scaffolding(second)
        return [query] if second == query else [query, second]

    def search(
        self,
        query: str,
        *,
        session: str,
        k: int = 10,
        from_item: int | None = None,
        to_item: int | None = None,
        within: Spans | None = None,
    ) -> list[Hit]:
        lists = [
            search_within(
                self._inner,
                asked,
                session=session,
                k=k,
                from_item=from_item,
                to_item=to_item,
                within=within,
            )
            for asked in self.queries(query)
        ]
        if len(lists) == 1:
            return lists[0]
        if self._form == "mqmax":
            return max_score_fusion(lists, k=k)
        return reciprocal_rank_fusion(lists, k=k)
