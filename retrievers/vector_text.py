"""What a passage's vector is made from: its context and its words, the context said once.

The keeper indexes a transcript turn with its context, ``Caroline (1:56 pm on 8 May, 2023),
item 3``, and the turn's words still open with the header that context was read from
(``Caroline (1:56 pm on 8 May, 2023): I went to a support group…``). Indexed as ``context:
text``, a short message's vector is then half speaker, time and item: a mean-pooled embedding
of every word piece, where the header's thirty pieces outweigh a ten-word answer. The keyword
side is unaffected (BM25 counts a word once per passage however often it is repeated), so only
the embedding side chooses its form:

- ``whole``: ``context: text`` as indexed (the header said twice in a transcript's turn);
- ``once``: the header the words open with left out when the context already says it;
- ``short``: that, and the context without its time of day and item number
  (``Caroline (8 May, 2023): I went to a support group…``).

Measured on five LoCoMo conversations: ``bench/results/locomo_recall_round13.md``. Pure
functions.
"""

from __future__ import annotations

import re

VECTOR_TEXTS = ("whole", "once", "short")
DEFAULT_VECTOR_TEXT = "once"
"""What a new index embeds (measured: ``bench/results/locomo_recall_round13.md``)."""

_ITEM = re.compile(r",\s*item\s+\d+\s*$")
_TIME_OF_DAY = re.compile(
    r"\b\d{1,2}:\d{2}(?::\d{2})?\s*(?:[ap]\.?m\.?)?\s*(?:on\s+)?", re.IGNORECASE
)


def header_of(context: str) -> str:
    """The part of a context a transcript's header states (``who (when)``), without the item."""
    return _ITEM.sub("", context).strip()


def without_header(text: str, context: str) -> str:
    """``text`` without the ``who (when):`` header it opens with, when ``context`` says the same;
    ``text`` itself otherwise (or when nothing would be left)."""
    header = header_of(context)
    stripped = text.lstrip()
    if not header or not stripped.startswith(f"{header}:"):
        return text
    rest = stripped[len(header) + 1 :].strip()
    return rest or text


def short_context(context: str) -> str:
    """The context without its item number and time of day (``Caroline (1:56 pm on 8 May,
    2023), item 3`` → ``Caroline (8 May, 2023)``)."""
    shorter = _TIME_OF_DAY.sub("", header_of(context))
    return re.sub(r"\(\s+", "(", re.sub(r"\s{2,}", " ", shorter)).strip()


def vector_text(context: str, text: str, form: str = DEFAULT_VECTOR_TEXT) -> str:
    """What a vector of ``text`` (a passage or one of its sentences) with ``context`` embeds, in
    ``form`` (one of ``VECTOR_TEXTS``)."""
    if form == "whole":
        return f"{context}: {text}" if context else text
    words = without_header(text, context)
    said = short_context(context) if form == "short" else context
    return f"{said}: {words}" if said else words
