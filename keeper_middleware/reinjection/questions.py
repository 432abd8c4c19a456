"""Recognising new questions and instructions, the moments the RULES are repeated.

A pinned rule alone was applied 22 times in 29 over a long run; pinned and repeated next to each
question set, 29 in 29. The detector decides what counts as such a moment.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Iterable, Sequence
from itertools import compress, count
from typing import Protocol, runtime_checkable

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from keeper_middleware.messages.facts import is_final_answer, is_input, text_of


@runtime_checkable
class QuestionDetector(Protocol):
    """Says whether an incoming user message asks something (or instructs) the RULES govern."""

    def is_question(self, message: BaseMessage) -> bool: ...


class PatternQuestionDetector:
    """A user message is a question set when any pattern matches one of its lines."""

    __slots__ = ("_patterns",)

    def __init__(self, patterns: Sequence[str]) -> None:
        """Compile the patterns once.

        Args:
            patterns: regular expressions (multi-line mode: ``^`` matches at each line).

        Raises:
            re.error: a pattern does not compile (``KeeperConfig`` checks its own first).
        """
        self._patterns = tuple(re.compile(p, re.MULTILINE) for p in patterns)

    def is_question(self, message: BaseMessage) -> bool:
        if not is_input(message):
            return False
        text = text_of(message)
        return any(p.search(text) for p in self._patterns)


def open_question_index(
    messages: Sequence[BaseMessage], detector: QuestionDetector, start: int = 0
) -> int | None:
    """Index of the earliest question not yet answered by a final AI reply, or None.

    An open question is never moved out of view: a cut that removed a question set while the model
    was still searching cost seven answers in a measured run.
    """
    deciding: Sequence[int] = range(start, len(messages))
    if type(detector) is PatternQuestionDetector:  # its questions are user messages
        deciding = _users_and_answers(messages, start)
    return open_after(zip(deciding, map(messages.__getitem__, deciding), strict=True), detector)


def open_after(
    messages: Iterable[tuple[int, BaseMessage]],
    detector: QuestionDetector,
    open_at: int | None = None,
) -> int | None:
    """:func:`open_question_index` of the indexed ``messages`` read in order after a part of
    the conversation that left the question at ``open_at`` open (None: none): each message
    opens a question or closes it, so the answer goes on from where the part before left it
    (a step that only appends reads only what it appends)."""
    for index, message in messages:
        if detector.is_question(message):
            if open_at is None:
                open_at = index
        elif is_final_answer(message):
            open_at = None
    return open_at


_TOOL_CALLS = operator.attrgetter("tool_calls")


def _users_and_answers(messages: Sequence[BaseMessage], start: int) -> list[int]:
    """The indices from ``start`` of the messages that can open a question for the pattern
    detector (user messages) or close one (AI messages without tool calls): the others change
    nothing, and a tool loop's window is mostly calls and results, skipped here unread."""
    types = list(map(type, messages[start:]))
    kinds = set(types)
    users = {t for t in kinds if issubclass(t, HumanMessage)}
    replies = {t for t in kinds if issubclass(t, AIMessage)}
    # read at C speed: a window of thousands of calls and results costs no Python call each
    asking = compress(count(start), map(users.__contains__, types))
    said = list(compress(count(start), map(replies.__contains__, types)))
    calls = map(_TOOL_CALLS, map(messages.__getitem__, said))
    answering = compress(said, map(operator.not_, calls))
    return sorted({*asking, *answering})
