"""Query expansion with the speaker context, as benchmark options (``who``, ``qwho``).

Questions about a conversation name the people in it ("When did Caroline go to the support
group?"), and every passage now carries who said it in its context. Two ways to use that:

- ``qwho``: the query is written in the passages' own form, ``Name: question``, for each speaker
  it names, so the embedding side compares like with like (a passage is embedded as
  ``who (when), item N: text``); the keyword side sees the same words as before;
- ``who``: the candidates the backend returns (``depth`` times the hits wanted) are fused by
  reciprocal rank with the same candidates said by a speaker the question names, so the named
  speaker's turns rise without the others being dropped (a multi-hop answer may be the other's);
- ``when``: the same with the date context: the candidates whose context's date names every
  month and year the question names ("in July 2023", "on October 13, 2023") are fused in as a
  second list (a question that names no month or year is searched as it is).

The speakers are read from the passages' contexts as they are added (what an index knows), not
from the dataset. Measured in ``bench/results/locomo_recall.md``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from keeper_bench.locomo.wrapping import WrappedRetriever
from keeper_middleware.retrievers.base import Hit, Passage, Retriever, Spans, search_within
from keeper_middleware.retrievers.hybrid import reciprocal_rank_fusion
from keeper_middleware.retrievers.named_context import named_times, speaker_of

DEPTH = 4


class SpeakerRetriever(WrappedRetriever):
    """Wraps a retriever; ``rewrite`` is the ``qwho`` form, ``boost`` the ``who`` fusion,
    ``dates`` the ``when`` fusion."""

    def __init__(
        self, inner: Retriever, *, rewrite: bool, boost: bool, dates: bool = False
    ) -> None:
        super().__init__(inner)
        self._rewrite = rewrite
        self._boost = boost
        self._dates = dates
        self._speakers: set[str] = set()

    def add(self, passages: Sequence[Passage]) -> None:
        for passage in passages:
            who = speaker_of(passage.context)
            if who and who not in ("user", "assistant", "system", "tool"):
                self._speakers.add(who)
        self._inner.add(passages)

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
        named = [s for s in sorted(self._speakers) if re.search(rf"\b{re.escape(s)}\b", query)]
        asked = query
        if self._rewrite and named:
            asked = " ".join(f"{name}:" for name in named) + " " + query
        times = named_times(query) if self._dates else set()
        if not ((self._boost and named) or times):
            return search_within(
                self._inner,
                asked,
                session=session,
                k=k,
                from_item=from_item,
                to_item=to_item,
                within=within,
            )
        found = search_within(
            self._inner,
            asked,
            session=session,
            k=DEPTH * k,
            from_item=from_item,
            to_item=to_item,
            within=within,
        )
        lists = [found]
        if self._boost and named:
            lists.append([h for h in found if speaker_of(h.passage.context) in named])
        if times:
            lists.append([h for h in found if times <= named_times(h.passage.context)])
        return reciprocal_rank_fusion(lists, k=k)
