"""Each message classified once where it enters a step: whose it is, what it says, how big it is.

The arrivals, the window policy, the note dialogue and the archive all ask the same questions of
a message: is it the keeper's own (and of which kind), what is its visible text, how many tokens
does it take by the configured counter, does it ask a new question. Asked in each module, they
were asked again for the same message at every decision of a step (its size up to four times).
An :class:`Entry` is made once per message per step, where the messages enter the step, and the
step's pure parts read the answers from it. Text, size and question are worked out on first use,
so a message no decision looks at costs nothing.

An entry belongs to one step: a message replaced during the step (an excerpt, a NOTES message
no longer counting kept turns) gets a new entry, and entries never outlive the step (a counter
or detector may be swapped between steps).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

from langchain_core.messages import BaseMessage, SystemMessage, ToolMessage

from keeper_middleware.messages.facts import keeper_kind, text_of
from keeper_middleware.reinjection.questions import QuestionDetector
from keeper_middleware.tokens.counting import TokenCounter


@dataclass(frozen=True, eq=False)
class Entry:
    """One message of a step with what the keeper decides by: kind, text, size, question."""

    message: BaseMessage
    counter: TokenCounter = field(repr=False)
    detector: QuestionDetector = field(repr=False)

    @cached_property
    def kind(self) -> str | None:
        """The kind of a keeper-authored message ("notes", "rules", ...); None for others'."""
        return keeper_kind(self.message)

    @cached_property
    def text(self) -> str:
        """The visible text (string content, or the text parts of list content)."""
        return text_of(self.message)

    @cached_property
    def tokens(self) -> int:
        """The message's size alone, by the configured counter."""
        return self.counter.count_messages([self.message])

    @cached_property
    def question(self) -> bool:
        """Whether it asks a new question (the moments the RULES are repeated)."""
        return self.detector.is_question(self.message)

    @property
    def id(self) -> str:
        return str(self.message.id)

    @property
    def is_system(self) -> bool:
        return isinstance(self.message, SystemMessage)

    @property
    def is_tool_result(self) -> bool:
        return isinstance(self.message, ToolMessage)

    def fresh(self, seen: set[str]) -> bool:
        """A message this keeper has not taken in yet (its own messages and the system prompt
        are never new inputs)."""
        return self.id not in seen and self.kind is None and not self.is_system


def classify(
    messages: Sequence[BaseMessage],
    counter: TokenCounter,
    detector: QuestionDetector,
    known: Sequence[Entry] = (),
) -> list[Entry]:
    """An entry per message; an entry in ``known`` of the very same message object is reused
    (what was worked out for it stands: the message is unchanged)."""
    reuse = {id(entry.message): entry for entry in known}
    entries: list[Entry] = []
    for message in messages:
        entry = reuse.get(id(message))
        if entry is None or entry.message is not message:
            entry = Entry(message, counter, detector)
        entries.append(entry)
    return entries


def messages_of(entries: Sequence[Entry]) -> list[BaseMessage]:
    """The messages, in order, for the parts that read plain messages."""
    return [entry.message for entry in entries]
