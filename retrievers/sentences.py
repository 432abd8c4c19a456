"""Sentence splitting shared by every backend, so all of them index the same passages.

A passage is one sentence of prose, one line of a list, or one line of code: newlines are hard
breaks, because a list item or a line of code read across a line break means something else.
A line without sentence punctuation that runs on (a minified file, a pasted log) is cut on word
boundaries into chunks of at most ``MAX_PASSAGE_CHARS``, so no passage drowns its own words.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from keeper_middleware.errors import ConfigurationError
from keeper_middleware.retrievers.base import Passage

MAX_PASSAGE_CHARS = 400
"""Longest passage; longer sentences and lines are cut on word boundaries."""

_ABBREVIATIONS = frozenset(
    {
        "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "rev", "gen", "col", "capt",
        "lt", "sgt", "gov", "sen", "rep", "hon", "vs", "etc", "e.g", "i.e", "cf", "al", "approx",
        "fig", "figs", "eq", "vol", "no", "nos", "p", "pp", "ch", "sec", "inc", "ltd", "co",
        "corp", "dept", "est", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept",
        "oct", "nov", "dec", "a.m", "p.m", "u.s", "u.k", "ph.d",
    }
)  # fmt: skip
"""Words whose period does not end a sentence when a lowercase word or a number follows."""

_TITLES = frozenset({"mr", "mrs", "ms", "dr", "prof", "st", "mt", "rev", "gen", "capt", "lt"})
"""Abbreviations that precede a name, so not even a capital after them starts a sentence."""

_SENTENCE_END = re.compile(r"(?:\.{2,}|…|[.!?]+)[\"'”’)\]]*(?=\s)")
_LIST_MARKER = re.compile(r"\s*(?:\d{1,3}|[A-Za-z]|[ivxlcdm]{1,5})\s*")
_CODE_HINT = re.compile(
    r"[{};]\s*$|^\s*(?:def|class|import|from|return|if|for|while|elif|else|try|except|with|fn|"
    r"let|const|var|function|pub|#include|//|/\*|\*|#!)\b|==|!=|=>|->|::|\w\(\)|^\s*[@$>]"
)
_FENCE = re.compile(r"^\s*(?:```|~~~)")
_WORD = re.compile(r"\w", re.UNICODE)
_WORDS = re.compile(r"\w+", re.UNICODE)


def has_searchable_text(query: str) -> bool:
    """A query of only punctuation or whitespace finds nothing in any backend."""
    return _WORD.search(query) is not None


def split_sentences(text: str) -> list[str]:
    """Cuts text into passages: sentences of prose, and whole lines of lists and code."""
    passages: list[str] = []
    in_fence = False
    for line in text.splitlines():
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        if not line.strip():
            continue
        if in_fence or _looks_like_code(line):
            passages.extend(_cut_long(line.strip()))
            continue
        for sentence in _split_prose_line(line):
            passages.extend(_cut_long(sentence))
    return passages


def passages_from_text(
    session: str, item: int, text: str, start_position: int, *, context: str = ""
) -> list[Passage]:
    """Numbers the sentences of one input from ``start_position`` on, all under the same item
    and with the same context."""
    return [
        Passage(
            session=session,
            item=item,
            position=start_position + offset,
            text=sentence,
            context=context,
        )
        for offset, sentence in enumerate(split_sentences(text))
    ]


def long_sentences(sentences: Sequence[str], min_words: int) -> list[tuple[int, str]]:
    """The sentences of at least ``min_words`` words, as (index, text)."""
    return [(i, s) for i, s in enumerate(sentences) if len(_WORDS.findall(s)) >= min_words]


def sentence_groups(sentences: Sequence[str], min_words: int) -> list[tuple[int, str]]:
    """Consecutive sentences joined until each group holds at least ``min_words`` words, as
    (index of its first sentence, text); a short rest joins the group before it.

    A vector per punctuation mark spends most of its work on interjections ("Thanks, Mel!",
    "Wow!") that say nothing alone and on the context repeated in front of each; a group of a
    statement's worth of words costs fewer vectors and keeps each one about something.
    ``min_words`` 1 gives each sentence with a word its own group."""
    if min_words < 1:
        raise ConfigurationError(f"min_words must be a positive int, got {min_words}.")
    groups: list[tuple[int, list[str]]] = []
    words = 0
    for index, sentence in enumerate(sentences):
        if groups and words < min_words:
            groups[-1][1].append(sentence)
        else:
            groups.append((index, [sentence]))
            words = 0
        words += len(_WORDS.findall(sentence))
    if len(groups) > 1 and words < min_words:
        _, rest = groups.pop()
        groups[-1][1].extend(rest)
    return [(first, " ".join(group)) for first, group in groups]


def _looks_like_code(line: str) -> bool:
    if line.startswith(("    ", "\t")):
        return True
    return _CODE_HINT.search(line) is not None


def _split_prose_line(line: str) -> list[str]:
    sentences: list[str] = []
    start = 0
    for match in _SENTENCE_END.finditer(line):
        end = match.end()
        if _ends_sentence(line, start, match.start(), match.group(), end):
            sentence = line[start:end].strip()
            if sentence:
                sentences.append(sentence)
            start = end
    rest = line[start:].strip()
    if rest:
        sentences.append(rest)
    return sentences


def _ends_sentence(line: str, start: int, mark_start: int, mark: str, end: int) -> bool:
    """Decides whether the punctuation at ``mark_start`` closes a sentence."""
    following = line[end:].lstrip()
    if not following:
        return True
    first = following[0]
    before = line[start:mark_start]
    if _LIST_MARKER.fullmatch(before):
        return False  # "1. First item", "a. option"
    starts_upper = first.isupper() or first in "\"'“‘([" or first.isdigit()
    if mark.startswith(("..", "…")):
        return starts_upper  # an ellipsis mid-sentence is followed by a lowercase word
    word = _last_word(before)
    if mark.startswith("."):
        if word.lower() in _TITLES:
            return False
        if len(word) == 1 and word.isupper():
            return False  # an initial: "J. Smith"
        if word.lower() in _ABBREVIATIONS and not (first.isupper() and word.lower() == "etc"):
            return not (first.islower() or first.isdigit())
    if starts_upper:
        return True
    next_word = following.split(None, 1)[0]
    # a name with digits ("domo86 was lost.") starts a sentence even in lowercase
    return any(ch.isdigit() for ch in next_word)


def _last_word(text: str) -> str:
    parts = text.rstrip().rsplit(None, 1)
    word = parts[-1] if parts else ""
    return word.lstrip("\"'“‘([")


def _cut_long(text: str) -> list[str]:
    if len(text) <= MAX_PASSAGE_CHARS:
        return [text]
    chunks: list[str] = []
    current = ""
    for word in text.split():
        while len(word) > MAX_PASSAGE_CHARS:  # one unbroken token longer than a passage
            if current:
                chunks.append(current)
                current = ""
            chunks.append(word[:MAX_PASSAGE_CHARS])
            word = word[MAX_PASSAGE_CHARS:]
        if current and len(current) + 1 + len(word) > MAX_PASSAGE_CHARS:
            chunks.append(current)
            current = word
        else:
            current = f"{current} {word}" if current else word
    if current:
        chunks.append(current)
    return chunks
