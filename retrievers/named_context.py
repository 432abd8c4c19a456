"""Names and dates in a question matched to the speaker and date context of the passages.

Questions about a conversation name its people and its times ("What did Melanie paint in July
2023?"), and every passage the keeper indexes carries who said it and when in its context
(``Melanie (8 July, 2023), item 3``). BM25 alone counts a name as one more word, so a turn of the
other speaker that repeats the question's words outranks the named speaker's answer. Here the
keyword candidates are fused by reciprocal rank with two
sub-lists of themselves: those said by a speaker the question names, and those dated in every
month and year it names. Only the best ``POOL`` candidates are fused; those after them follow in
their own order. No candidate is dropped (a multi-hop answer may be the other speaker's);
a question that names neither is ranked as before.

The speakers are read from the candidates' own contexts, so nothing is learnt at indexing time
and a reopened index behaves the same. Chosen on five LoCoMo conversations, where it gained
on each conversation and on both halves of each (``bench/results/locomo_recall.md``, twelfth
round).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from keeper_middleware.retrievers.base import Hit
from keeper_middleware.retrievers.hybrid import reciprocal_rank_fusion
from keeper_middleware.retrievers.passages import STOPWORDS

POOL = 40
"""How many of the best candidates are fused: four times the ten hits the search tool shows (as
measured). Fixed, not a multiple of the hits asked for, so the order does not depend on how many
are asked for: the search tool asks for 200 to count the matches and shows the first ten, and
those ten are the ten a search for ten returns."""

ROLES = frozenset(("user", "assistant", "system", "tool", "human", "ai"))
"""Speakers that are roles, not names: a question saying "the user" names no one."""

MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
_MONTH_OR_YEAR = re.compile(rf"\b(?:{'|'.join(MONTHS)}|(?:19|20)\d\d)\b")
_WHO = re.compile(r"^([^\W\d_][\w'’ -]*?)\s*(?:\(|,|$)")
_CAPITALISED = re.compile(r"\b[^\W\d_a-z][\w'’-]*")


def speaker_of(context: str) -> str:
    """The ``who`` of a passage's context (``Caroline (8 May, 2023), item 3`` → Caroline)."""
    match = _WHO.match(context)
    return match.group(1).strip() if match else ""


def named_times(text: str) -> set[str]:
    """The month names and years a text names (``in July 2023`` → {July, 2023})."""
    return set(_MONTH_OR_YEAR.findall(text))


def may_name(query: str) -> bool:
    """Whether a query may name a speaker (a capitalised word that is not a stop word) or a
    month or year: only then are the deeper candidates worth fetching."""
    if _MONTH_OR_YEAR.search(query):
        return True
    return any(w.lower() not in STOPWORDS for w in _CAPITALISED.findall(query))


def fuse_named(
    query: str, candidates: Sequence[Hit], *, k: int, speakers: bool = True
) -> list[Hit]:
    """The top ``k`` of ``candidates`` (best first), with those of the speakers (unless not
    ``speakers``) and of the months and years the query names fused in as more lists.
    ``candidates`` should be the best ``POOL`` (see :func:`fuse_pool`)."""
    named = {
        who
        for who in {speaker_of(h.passage.context) for h in candidates}
        if speakers
        and who
        and who.lower() not in ROLES
        and re.search(rf"\b{re.escape(who)}\b", query)
    }
    times = named_times(query)
    lists = [list(candidates)]
    if named:
        lists.append([h for h in candidates if speaker_of(h.passage.context) in named])
    if times:
        lists.append([h for h in candidates if times <= named_times(h.passage.context)])
    if len(lists) == 1:
        return list(candidates[:k])
    return reciprocal_rank_fusion(lists, k=k)


def fuse_pool(query: str, candidates: Sequence[Hit], *, k: int, speakers: bool = True) -> list[Hit]:
    """The best ``k``: the first ``POOL`` candidates fused (:func:`fuse_named`), then the rest
    in their own order."""
    head = fuse_named(query, candidates[:POOL], k=POOL, speakers=speakers)
    return (head + list(candidates[POOL:]))[:k]
