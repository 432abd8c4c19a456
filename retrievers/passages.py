"""Message passages: a whole message (cut into bounded chunks when long) as one search unit.

Conversation is written in messages, and most of a message's sentences mean little alone ("Wow,
that's great!"): indexed one by one they crowd out the sentences that matter, and a speaker or a
date written once reaches only the first. Measured on LoCoMo (bench/results/locomo_recall.md),
whole messages carrying their context find the evidence turn far more often than sentences do,
for every backend. A hit on a message still points at one sentence: the one that shares the most
words with the query is marked, and shown with the sentence after it, inside a bounded excerpt.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from keeper_middleware.errors import ConfigurationError
from keeper_middleware.retrievers.base import Hit, Passage
from keeper_middleware.retrievers.sentences import passages_from_text, split_sentences

MAX_MESSAGE_CHARS = 1_000
"""Longest message chunk (about 250 word pieces, what a small embedding model reads whole);
a longer message is cut between sentences into chunks of at most this many characters."""

EXCERPT_CHARS = 600
"""Longest excerpt a hit shows of its message."""

MARK_OPEN, MARK_CLOSE = "»", "«"

PASSAGE_UNITS = ("sentences", "messages")
"""What an archive indexes as one passage: each sentence (the first form), or each message cut
into bounded chunks of whole sentences."""

STOPWORDS = frozenset(
    "a an and are as at be but by did do does for from had has have he her his how i in is it "  # noqa: SIM905
    "its me my of on or our she so that the their them they this to was we were what when where "
    "which who why will with would you your".split()
)
"""Words that say nothing about what a question is after (English)."""

_WORD = re.compile(r"\w+", re.UNICODE)
_SUFFIXES = ("ing", "ed", "es", "s", "ly")


def passages_from_message(
    session: str,
    item: int,
    text: str,
    start_position: int,
    *,
    context: str = "",
    max_chars: int = MAX_MESSAGE_CHARS,
) -> list[Passage]:
    """One passage per chunk of whole sentences of one line, at most ``max_chars`` long (a
    sentence is never split unless it alone is longer); every chunk carries ``context``."""
    if max_chars < 50:
        raise ConfigurationError(
            f"max_chars must be at least 50 (one sentence fits), got {max_chars}."
        )
    chunks: list[str] = []
    for unit in _units(text):
        current = ""
        for sentence in unit:
            pieces = [sentence] if len(sentence) <= max_chars else _cut(sentence, max_chars)
            for piece in pieces:
                if current and len(current) + 1 + len(piece) > max_chars:
                    chunks.append(current)
                    current = piece
                else:
                    current = f"{current} {piece}" if current else piece
        if current:
            chunks.append(current)
    return [
        Passage(
            session=session,
            item=item,
            position=start_position + offset,
            text=chunk,
            context=context,
        )
        for offset, chunk in enumerate(chunks)
    ]


def passages_of(
    unit: str, session: str, item: int, text: str, start_position: int, *, context: str = ""
) -> list[Passage]:
    """The passages of one input, cut as ``unit`` (one of ``PASSAGE_UNITS``) says."""
    if unit == "messages":
        return passages_from_message(session, item, text, start_position, context=context)
    if unit == "sentences":
        return passages_from_text(session, item, text, start_position, context=context)
    raise ConfigurationError(f"passages must be one of {', '.join(PASSAGE_UNITS)}, got {unit!r}.")


def _units(text: str) -> list[list[str]]:
    """The sentences of each line: a line is a turn in a transcript, a paragraph in prose, an
    entry in a list, so two lines never share a chunk."""
    units: list[list[str]] = []
    for line in text.splitlines():
        sentences = split_sentences(line)
        if sentences:
            units.append(sentences)
    return units


def content_words(text: str) -> set[str]:
    """Lowercase words of ``text`` without stop words, with common suffixes taken off."""
    return {_strip_suffix(w) for w in _WORD.findall(text.lower()) if w not in STOPWORDS}


def best_sentence(text: str, query: str) -> int:
    """The index of the sentence of ``text`` sharing the most content words with ``query``
    (the first one on a tie, and 0 when none shares a word)."""
    return _best_sentence(text, content_words(query))


def _best_sentence(text: str, wanted: set[str]) -> int:
    best, best_count = 0, 0
    for index, sentence in enumerate(split_sentences(text)):
        count = len(wanted & content_words(sentence))
        if count > best_count:
            best, best_count = index, count
    return best


def mark_hits(hits: Sequence[Hit], query: str) -> list[Hit]:
    """Hits with their best-matching sentence found (a one-sentence passage keeps 0)."""
    marked: list[Hit] = []
    wanted = content_words(query)
    for hit in hits:
        index = _best_sentence(hit.passage.text, wanted)
        marked.append(
            hit
            if index == hit.sentence
            else Hit(passage=hit.passage, score=hit.score, next_text=hit.next_text, sentence=index)
        )
    return marked


def excerpt(hit: Hit, *, limit: int = EXCERPT_CHARS) -> str:
    """The hit as a result line shows it: a one-sentence passage and the next passage, as
    ``sentence → next: following``; a message with its matched sentence marked and the
    sentence after it kept, cut to about ``limit`` characters around them."""
    sentences = split_sentences(hit.passage.text)
    if len(sentences) <= 1:
        line = hit.passage.text
        if hit.next_text:
            line += f" → next: {hit.next_text}"
        return line
    index = min(max(hit.sentence, 0), len(sentences) - 1)
    matched = f"{MARK_OPEN}{sentences[index]}{MARK_CLOSE}"
    kept = [matched, *sentences[index + 1 : index + 2]]
    after = sentences[index + 2 :]
    before = sentences[:index]
    text = " ".join(kept)
    # the sentences that go on speaking of what was matched ("it", "they") come before any
    # earlier context: "X came up. A took 3 from it. B took 13 from it." is one change each
    while after and refers_back(after[0]) and len(text) + 1 + len(after[0]) <= limit:
        text = f"{text} {after.pop(0)}"
    while before and len(before[-1]) + 1 + len(text) <= limit:
        text = f"{before.pop()} {text}"
    while after and len(text) + 1 + len(after[0]) <= limit:
        text = f"{text} {after.pop(0)}"
    if before:
        text = f"… {text}"
    if after:
        text = f"{text} …"
    if index == len(sentences) - 1 and hit.next_text:
        following = split_sentences(hit.next_text)
        text += f" → next: {_clip(following[0] if following else hit.next_text, limit // 2)}"
    return _clip(text, 2 * limit)


REFERRING = frozenset(
    [
        "it",
        "its",
        "they",
        "them",
        "their",
        "he",
        "him",
        "his",
        "she",
        "her",
        "this",
        "these",
        "those",
    ]
)
"""Words by which a sentence speaks of something named before it (English)."""


def refers_back(sentence: str) -> bool:
    """Whether ``sentence`` speaks of something named before it (a referring word, such as
    "it"): what it says belongs to the sentence it follows."""
    return any(word in REFERRING for word in _WORD.findall(sentence.lower()))


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _strip_suffix(word: str) -> str:
    for suffix in _SUFFIXES:
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


def _cut(sentence: str, max_chars: int) -> list[str]:
    pieces: list[str] = []
    current = ""
    for word in sentence.split():
        while len(word) > max_chars:
            if current:
                pieces.append(current)
                current = ""
            pieces.append(word[:max_chars])
            word = word[max_chars:]
        if current and len(current) + 1 + len(word) > max_chars:
            pieces.append(current)
            current = word
        else:
            current = f"{current} {word}" if current else word
    if current:
        pieces.append(current)
    return pieces
