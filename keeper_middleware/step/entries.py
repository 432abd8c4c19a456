"""Each message classified once where it enters a step: whose it is, what it says, how big it is.

The arrivals, the window policy, the note dialogue and the archive all ask the same questions of
a message: is it the keeper's own (and of which kind), what is its visible text, how many tokens
does it take by the configured counter, does it ask a new question. Asked in each module, they
were asked again for the same message at every decision of a step (its size up to four times).
An :class:`Entry` is made once per message per step, where the messages enter the step, and the
step's pure parts read the answers from it. Text, size and question are worked out on first use,
so a message no decision looks at costs nothing.

An entry belongs to one step: a message replaced during the step (an excerpt, a NOTES message
no longer counting kept turns) gets a new entry. What an entry worked out may outlive the step:
given a :class:`~keeper_middleware.messages.memo.SameMessageMemo` (one per counter and detector,
:class:`~keeper_middleware.step.window.WindowPolicy` keeps it), the next step's entry of the very same,
unchanged message object starts from those answers, so a step works out only its new messages.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from langchain_core.messages import BaseMessage, SystemMessage, ToolMessage

from keeper_middleware.messages.facts import keeper_kind, text_of
from keeper_middleware.messages.memo import SameMessageMemo
from keeper_middleware.reinjection.questions import QuestionDetector
from keeper_middleware.tokens.counting import TokenCounter


@dataclass(frozen=True, eq=False)
class Entry:
    """One message of a step with what the keeper decides by: kind, text, size, question."""

    message: BaseMessage
    counter: TokenCounter = field(repr=False)
    detector: QuestionDetector = field(repr=False)

    facts: dict[str, Any] = field(default_factory=dict, repr=False)
    """The answers worked out so far (shared with the entries of the same unchanged message in
    later steps, through a memo: they hold no reference to the message)."""

    def __post_init__(self) -> None:
        # what every decision asks, set once as attributes (``id`` and ``is_system`` below are
        # then never computed); a frozen dataclass's fields are set the same way
        message = self.message
        self.__dict__.update(id=str(message.id), is_system=isinstance(message, SystemMessage))

    @property
    def kind(self) -> str | None:
        """The kind of a keeper-authored message ("notes", "rules", ...); None for others'."""
        facts = self.facts
        if "kind" not in facts:
            facts["kind"] = keeper_kind(self.message)
        kind: str | None = facts["kind"]
        return kind

    @property
    def text(self) -> str:
        """The visible text (string content, or the text parts of list content)."""
        found: str | None = self.facts.get("text")
        if found is None:
            found = self.facts["text"] = text_of(self.message)
        return found

    @property
    def tokens(self) -> int:
        """The message's size alone, by the configured counter."""
        found: int | None = self.facts.get("tokens")
        if found is None:
            found = self.facts["tokens"] = self.counter.count_messages((self.message,))
        return found

    @property
    def question(self) -> bool:
        """Whether it asks a new question (the moments the RULES are repeated)."""
        found: bool | None = self.facts.get("question")
        if found is None:
            found = self.facts["question"] = self.detector.is_question(self.message)
        return found

    # read many times a step (the window's decisions ask every message): worked out once, then
    # an attribute of the entry (an entry's message never changes: a changed one gets a new entry)
    @cached_property
    def id(self) -> str:
        return str(self.message.id)

    @cached_property
    def is_system(self) -> bool:
        return isinstance(self.message, SystemMessage)

    @cached_property
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
    memo: SameMessageMemo[dict[str, Any]] | None = None,
) -> list[Entry]:
    """An entry per message; an entry in ``known`` of the very same message object is reused
    (what was worked out for it stands: the message is unchanged). A new entry starts from what
    ``memo`` kept for the same unchanged object in an earlier step (``memo`` must belong to
    ``counter`` and ``detector``: the answers are theirs)."""
    if known and _same_messages(known, messages):
        return list(known)  # nothing was replaced: every entry stands (a C-speed check)
    reuse = {id(entry.message): entry for entry in known} if known else {}
    entries: list[Entry] = []
    for message in messages:
        entry = reuse.get(id(message))
        if entry is None or entry.message is not message:
            facts = memo.get(message) if memo is not None else None
            if facts is None:
                entry = Entry(message, counter, detector)
                if memo is not None:
                    memo.put(message, entry.facts)
            else:
                entry = _entry(message, counter, detector, facts)
        entries.append(entry)
    return entries


_MESSAGE = operator.attrgetter("message")
_ID = operator.attrgetter("id")
_FACTS = operator.attrgetter("facts")
_TOKENS_FACT = operator.itemgetter("tokens")
_TOKENS = operator.attrgetter("tokens")


def sizes_of(entries: Sequence[Entry]) -> list[int]:
    """Each entry's :attr:`Entry.tokens`, read from what the entries already worked out at C
    speed (a window taken in before is sized already); any entry not sized yet is sized."""
    try:
        return list(map(_TOKENS_FACT, map(_FACTS, entries)))
    except KeyError:
        return list(map(_TOKENS, entries))


def ids_of(messages: Sequence[BaseMessage]) -> list[str]:
    """Each message's id as an entry gives it (``str(message.id)``), read at C speed."""
    return list(map(str, map(_ID, messages)))


def first_fresh(entries: Sequence[Entry], seen: set[str]) -> int:
    """The index of the first entry that is :meth:`Entry.fresh` (the end when none is): only
    the entries whose id is not in ``seen`` are asked, found by a set difference, so a window
    of thousands of messages taken in before costs no Python call per message."""
    ids = ids_of(messages_of(entries))
    unseen = set(ids).difference(seen)
    if unseen:
        for index, msg_id in enumerate(ids):
            if msg_id in unseen and entries[index].fresh(seen):
                return index
    return len(entries)


def _same_messages(known: Sequence[Entry], messages: Sequence[BaseMessage]) -> bool:
    """Whether ``known`` are entries of exactly ``messages``, in order, each object once (then
    reusing them is what matching them one by one gives)."""
    return (
        len(known) == len(messages)
        and all(map(operator.is_, map(_MESSAGE, known), messages))
        and len(set(map(id, messages))) == len(messages)
    )


def _entry(
    message: BaseMessage, counter: TokenCounter, detector: QuestionDetector, facts: dict[str, Any]
) -> Entry:
    """``Entry(message, counter, detector, facts)`` without the frozen dataclass's field-by-field
    ``__init__`` (a step makes one for every message in view: a third of classifying them)."""
    entry = object.__new__(Entry)
    entry.__dict__.update(
        message=message,
        counter=counter,
        detector=detector,
        facts=facts,
        id=str(message.id),
        is_system=isinstance(message, SystemMessage),
    )
    return entry


def messages_of(entries: Sequence[Entry]) -> list[BaseMessage]:
    """The messages, in order, for the parts that read plain messages (read at C speed)."""
    return list(map(_MESSAGE, entries))
