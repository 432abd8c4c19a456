"""Passages a keyword search should not return: replies that say nothing, and the question itself.

BM25 favours short passages, and every passage is indexed with its context (who said it, when):
a question that names a speaker ("What did Melanie paint?") matches that speaker's "ok" or
"Thanks!" on the name alone, and such a two-word passage outranks the long message that holds
the answer. A question asked in the conversation and archived there matches itself on every
word. Neither is anything the searcher can use, so the keyword backends drop them from their
results (they stay archived and indexed: the filter is on what a search returns).
"""

from __future__ import annotations

import re

from keeper_middleware.retrievers.passages import STOPWORDS, content_words

ACKNOWLEDGEMENTS = frozenset(
    "ok okay k kk yes yeah yep yup no nope nah sure thanks thank thx ty lol haha hahaha hehe "  # noqa: SIM905
    "hmm hm mm oh ah uh um wow cool nice great good fine right alright awesome hi hello hey bye "
    "goodbye see ya much very really too indeed agreed done got noted".split()
)
"""Words a reply is made of when it only acknowledges ("Ok, thanks!", "Yeah, cool")."""

_CONTRACTED = frozenset(("s", "t", "ll", "re", "ve", "d", "m", "that", "there", "sounds", "so"))
"""What is left of "that's", "it'll", "I'm" once cut at the apostrophe, and their usual company."""

_WORD = re.compile(r"\w+", re.UNICODE)


def says_nothing(text: str) -> bool:
    """Whether every word of ``text`` is a stop word or an acknowledgement (or it has none)."""
    return all(
        w in STOPWORDS or w in ACKNOWLEDGEMENTS or w in _CONTRACTED
        for w in _WORD.findall(text.lower())
    )


def is_the_question(text: str, query: str) -> bool:
    """Whether ``text`` is the question ``query`` asked again: a question (ending in "?") with
    the same content words, so it holds nothing the query does not."""
    if not text.rstrip().endswith("?"):
        return False
    words = content_words(text)
    return bool(words) and words == content_words(query)


def useless_hit(text: str, query: str) -> bool:
    """A passage a search for ``query`` should skip (see the module docstring)."""
    return says_nothing(text) or is_the_question(text, query)
