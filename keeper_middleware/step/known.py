"""The entries a session's last step ended with, so that the next step classifies only what is new.

An adapter that keeps its messages between calls (the proxy's window, a LangChain agent's state)
hands the next step the very same message objects, with new ones after them. Classifying them
again through the message memo costs a check per message (about a microsecond each: thousands a
step in a long window) although none of them changed. The step's entries are kept per session
instead, and the next step reuses them for the messages that start its window, making entries only
for the messages after them.

They are reused only when that gives exactly what classifying afresh gives:

- the window starts with the very same objects, in the same order (one comparison at C speed);
- none of them changed in place since (each message's fields are compared with a copy taken when
  it was kept, at C speed: a change anywhere, even in a field no answer depends on, is treated
  as a change), unless the caller declared that it never changes a message in place
  (``unchanged_in_place``, below);

anything else (an edit, a regenerate, a truncation, another prefix, a cut) classifies the whole
window as before. The entries' answers are the same dicts the memo holds for those objects, so a
reused entry answers what a fresh one would.

Comparing the fields costs more than anything else a step that appends does (a dict comparison
per message: about 4 ms a step with 5,000 messages in view). A caller that never changes a
message in place once a step has seen it (it makes a changed copy under the same id instead, as
keeper-proxy does: its window is its own, rebuilt from the client's JSON, and every change it or
the keeper makes is a new object) says so with ``unchanged_in_place``: then the very same objects
are the very same messages, and only their identity is checked. LangChain and LangGraph callers
may change a message in place, so the check stays on unless the caller opts out.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import BaseMessage

from keeper_middleware.messages.memo import copy_fields
from keeper_middleware.step.entries import Entry, messages_of
from keeper_middleware.step.tail import WindowFacts

__all__ = ["KnownEntries", "LastEntries", "Tail"]

_MOST_SESSIONS = 256
"""Sessions whose last entries are kept at once (the least recently stepped leave first; each
keeps a copy of its messages' fields, about half a kilobyte a message besides the strings)."""


@dataclass(frozen=True, slots=True)
class Tail:
    """What the whole-window passes found in the window a step ended with, and the state it
    handed back, so that a step that only appends to that window starts from them
    (:mod:`~keeper_middleware.step.tail`)."""

    facts: WindowFacts
    state: dict[str, Any]
    """A private copy of the keeper state the step handed back: the next step takes this path
    only when it is handed back a state equal to it (a caller may change its own in place)."""
    ids: set[str]
    """The ids of the window's messages (the state's ``seen`` ids are the same ones)."""


@dataclass(frozen=True, slots=True)
class KnownEntries:
    """One session's last entries, their messages and a copy of each message's fields."""

    entries: list[Entry]
    messages: list[BaseMessage]
    fields: list[dict[str, Any]] | None
    """None when the caller never changes a message in place (nothing to compare)."""
    tail: Tail | None = None
    """The window's facts, when the step that kept them ended without a cut or a change."""

    def reusable(self, messages: Sequence[BaseMessage]) -> int:
        """How many of ``messages`` (from the start) these entries stand for: all of them when
        ``messages`` start with the very same, unchanged objects, else none."""
        count = len(self.messages)
        if count == 0 or count > len(messages):
            return 0
        # ``map`` stops at the shorter list: the first ``count`` of ``messages``, not copied
        if not all(map(operator.is_, self.messages, messages)):
            return 0
        if self.fields is not None and list(map(vars, self.messages)) != self.fields:
            return 0  # (the very same objects as ``messages`` start with, checked above)
        return count

    def facts_of(self, messages: Sequence[BaseMessage]) -> WindowFacts | None:
        """The kept window facts when ``messages`` are exactly the window they were found in
        (the same objects, none after them), and no message can have changed since (the
        caller never changes one in place); else None (walk the window)."""
        tail = self.tail
        if (
            tail is None
            or self.fields is not None
            or len(messages) != len(self.messages)
            or tail.facts.length != len(messages)
            or not all(map(operator.is_, self.messages, messages))
        ):
            return None
        return tail.facts


class LastEntries:
    """Per session, the entries its last step ended with (bounded; safe between threads)."""

    def __init__(self, most: int = _MOST_SESSIONS, *, unchanged_in_place: bool = False) -> None:
        """Keep up to ``most`` sessions' last entries.

        Args:
            most: sessions kept at once (the least recently stepped leave first).
            unchanged_in_place: the caller never changes a message in place after a step has
                seen it (a changed message is a new object): the kept messages' fields are
                neither copied nor compared, their identity stands for them.
        """
        self._most = most
        self._copied = not unchanged_in_place
        self._known: dict[str, KnownEntries] = {}
        self._lock = threading.Lock()

    def classify(
        self,
        session: str,
        messages: Sequence[BaseMessage],
        classify: Callable[[Sequence[BaseMessage]], list[Entry]],
    ) -> list[Entry]:
        """The entries of ``messages``: the kept ones for the messages they stand for, and
        ``classify`` of the rest (of all of them when none stand)."""
        known = self._known.get(session)
        count = 0 if known is None else known.reusable(messages)
        if known is None or count == 0:
            self.forget(session)  # what is kept no longer holds: the step's end copies anew
            return classify(messages)
        if count == len(messages):
            return list(known.entries)
        return [*known.entries, *classify(messages[count:])]

    def appended(
        self,
        session: str,
        messages: Sequence[BaseMessage],
        state: Any,
        fits: Callable[[KnownEntries, Tail, Sequence[BaseMessage]], bool],
    ) -> tuple[KnownEntries, Tail] | None:
        """The session's last entries and window facts, taken out (a step that fails leaves
        nothing kept), when ``messages`` are that window, unchanged, with messages appended,
        ``state`` equals the state the step handed back, and ``fits`` says the appended
        messages leave the window's facts standing; else None, and nothing is taken."""
        known = self._known.get(session)
        if known is None or known.tail is None or type(state) is not dict:
            return None
        tail = known.tail
        count = known.reusable(messages)
        if count == 0 or state != tail.state or not fits(known, tail, messages[count:]):
            return None
        with self._lock:
            if self._known.get(session) is not known:
                return None
            del self._known[session]
        return known, tail

    def keep(
        self,
        session: str,
        entries: list[Entry],
        messages: Sequence[BaseMessage],
        tail: Tail | None = None,
        *,
        before: KnownEntries | None = None,
    ) -> None:
        """Keep the entries a step ended with, when they are the entries of ``messages`` (the
        step's result); otherwise forget the session's (its next step classifies afresh). The
        ``entries`` list is kept as it is (the step that made it is done with it).
        ``tail``: the window's facts; ``before``: the entries the step started from, taken
        out by :meth:`appended` (their copies of fields are reused)."""
        known = before if before is not None else self._known.get(session)
        if before is not None and tail is not None:
            # the entries were made from them, in order (``appended``), and they start with
            # the very same objects as the window taken out, whose list is this step's to extend
            count = len(before.messages)
            ended = before.messages
            ended.extend(messages[count:])
        else:
            ended = messages_of(entries)
            if len(ended) != len(messages) or not all(map(operator.is_, ended, messages)):
                self.forget(session)
                return
            count = 0 if known is None else _prefix(known.messages, ended)
        fields: list[dict[str, Any]] | None
        if not self._copied:
            fields = None
        elif before is not None and count and before.fields is not None:
            fields = before.fields  # taken out: its list is this step's to extend
            del fields[count:]
            fields.extend(map(copy_fields, ended[count:]))
        else:
            fields = [
                *(known.fields[:count] if known is not None and known.fields is not None else ()),
                *map(copy_fields, ended[count:]),
            ]
        with self._lock:
            self._known.pop(session, None)
            if len(self._known) >= self._most:
                del self._known[next(iter(self._known))]
            self._known[session] = KnownEntries(entries, ended, fields, tail)

    def facts_of(self, session: str, messages: Sequence[BaseMessage]) -> WindowFacts | None:
        """The window facts ``session``'s last step ended with, when ``messages`` are that
        window, unchanged (:meth:`KnownEntries.facts_of`); else None."""
        known = self._known.get(session)
        return None if known is None else known.facts_of(messages)

    def forget(self, session: str) -> None:
        """Drop what is kept of ``session``."""
        with self._lock:
            self._known.pop(session, None)


def _prefix(before: list[BaseMessage], after: list[BaseMessage]) -> int:
    """``len(before)`` when ``after`` starts with the very same objects, else 0 (the kept copies
    of their fields still hold: a step that started from them checked them, and a step does not
    change its messages in place)."""
    count = len(before)
    if count <= len(after) and all(map(operator.is_, before, after[:count])):
        return count
    return 0
