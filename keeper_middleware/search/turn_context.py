"""What an archived turn's words do not say: who wrote it, when, and in which item.

Every passage the keeper indexes carries this context (indexed with the passage's words, never
shown as them), so a question that names a person or a date finds every sentence of the
message, not only the one that happened to carry a speaker. Measured on LoCoMo
(bench/results/locomo_recall.md): the same passages with their message's context find the
evidence far more often than without it, for every backend.

- **who**: the speaker of a transcript header (``Caroline (8 May, 2023): ...``), else the
  message's name, else its role (``user``, ``assistant``, ``tool <name>``, ``system``);
- **when**: a date the message states where a message says when it was written: in a
  transcript header, a bracketed stamp opening it (``[2023-05-08 13:56] ...``), or a first line
  that heads what follows (``Session 3 (1:56 pm on 8 May, 2023):``). A date inside the text is
  already among its words;
- **item**: the content's own number (``item 12``).

Pure functions: no I/O, nothing kept.
"""

from __future__ import annotations

import re

from keeper_middleware.archive.records import ArchivedTurn

ROLE_WORDS = {"human": "user", "ai": "assistant", "tool": "tool", "system": "system"}
"""How a turn's role is named in its context when no name says who wrote it."""

_MONTH = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?"
)
_DATE = re.compile(
    r"\d{4}-\d{1,2}-\d{1,2}(?:[ T]\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:\s*(?:Z|UTC|[+-]\d{2}:?\d{2}))?)?"
    r"|\d{1,2}[/.]\d{1,2}[/.]\d{2,4}"
    rf"|\d{{1,2}}(?:st|nd|rd|th)?\s+{_MONTH},?\s+\d{{4}}"
    rf"|{_MONTH}\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+\d{{4}}",
    re.IGNORECASE,
)
"""A calendar date (ISO, numeric, or with a month's name and a year)."""
_WORD = r"[^\W\d_](?:[^\W\d_]|['’.-]){0,24}"
_NAME = rf"{_WORD}(?: {_WORD}){{0,3}}"
"""A speaker: up to four words of letters (no digits: ``Item 3. Session 3`` is no one)."""
_TRANSCRIPT = re.compile(rf"\A\s*(?P<who>{_NAME})\s*\((?P<when>[^()\n]{{4,80}})\)\s*:")
"""``Speaker (when): text``: a transcript's turn."""
_STAMP = re.compile(rf"\A\s*\[(?P<when>[^\]\n]{{4,80}})\]\s*(?:(?P<who>{_NAME})\s*:)?")
"""``[when] text`` or ``[when] Speaker: text``: a logged line."""
_HEADING_CHARS = 160
"""Longest first line read as a heading of the lines after it."""


def turn_context(turn: ArchivedTurn) -> str:
    """The context of every passage of ``turn``: ``who (when), item N`` (parts it lacks left
    out), e.g. ``Caroline (1:56 pm on 8 May, 2023), item 3`` or ``user, item 12``."""
    who, when = stated_speaker_and_date(turn.content)
    if not who:
        who = turn.name or ""
        if turn.role == "tool":
            who = f"tool {who}" if who else "tool"
        elif not who:
            who = ROLE_WORDS.get(turn.role, turn.role)
    context = f"{who} ({when})" if when else who
    if turn.item is not None:
        context = f"{context}, item {turn.item}"
    return context


def stated_speaker_and_date(text: str) -> tuple[str, str]:
    """The speaker and the date a message's opening states, each "" when it states none."""
    for pattern in (_TRANSCRIPT, _STAMP):
        match = pattern.match(text)
        if match and _DATE.search(match.group("when")):
            return _clean(match.group("who") or ""), _clean(match.group("when"))
    first, newline, _ = text.lstrip().partition("\n")
    if newline and len(first) <= _HEADING_CHARS and first.rstrip().endswith(":"):
        found = _DATE.search(first)
        if found:
            return "", _clean(_around_date(first, found))
    return "", ""


def _around_date(line: str, found: re.Match[str]) -> str:
    """The date with the time that leads it in a heading (``1:56 pm on 8 May, 2023``)."""
    start = found.start()
    lead = re.search(
        r"\d{1,2}:\d{2}(?::\d{2})?\s*(?:[ap]\.?m\.?)?\s*(?:on\s+|,\s*)?$", line[:start]
    )
    return line[lead.start() if lead else start : found.end()]


def _clean(text: str) -> str:
    return " ".join(text.split())
