"""What was worked out from one message object, kept from step to step while it stays unchanged.

A session resends its whole history on every call, and every step asks the same questions of the
messages it has already seen (their size, whether they ask a question, their kind). The answers
are functions of a message's content, so they can be kept between steps; a step then works out
only what its new messages need. An adapter that keeps its messages between calls (the proxy
keeps the window it aligned, a LangChain agent its state) hands the very same objects to the next
step, so the memory is keyed by the object.

The memory can never serve an answer for content it was not worked out from:

- it is keyed by the object and holds it only weakly: a message that is gone takes its answers
  with it, and a new object (an edit, a message deserialised again by a checkpointer, another
  branch's copy) is worked out afresh;
- every answer is kept with a copy of what it could depend on (type, id, name, content, tool
  calls, tool call id, ``additional_kwargs``), compared again on every read: a message changed in
  place is worked out afresh too.

So a ``RemoveMessage``, a fork or a branch switch needs nothing of it: what is not in a step's
messages is simply not asked for, and what is asked for is answered for exactly its content.
"""

from __future__ import annotations

import logging
import operator
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from langchain_core.messages import BaseMessage

log = logging.getLogger(__name__)

V = TypeVar("V")

_MOST = 1 << 18
"""A bound on the messages remembered at once (they are held weakly, so this only guards
against a process holding an unbounded number of live messages)."""


_FIELDS = (
    "id",
    "name",
    "content",
    "tool_calls",
    "invalid_tool_calls",
    "tool_call_id",
    "additional_kwargs",
)
"""What an answer about a message may depend on, where its type has it."""

_ATOMS = frozenset({str, int, float, bool, type(None)})
"""Values that cannot change in place (exactly these types: a subclass may)."""

_Getter = Callable[[Mapping[str, Any]], tuple[Any, ...]]
_GETTERS: dict[type, _Getter] = {}


def _copy(value: Any) -> Any:
    """A copy of JSON-like data deep enough that changing the original in place shows
    (strings are kept as they are: they cannot change)."""
    kind = type(value)
    if kind in _ATOMS:  # most values: answered before the containers are asked
        return value
    # the atoms inside are kept without a call each (most of a message's values are atoms)
    atoms = _ATOMS
    if kind is dict or kind is list:  # the usual containers, an empty one made at C speed
        if not value:
            return kind()
        if kind is dict:
            return {k: v if type(v) in atoms else _copy(v) for k, v in value.items()}
        return [v if type(v) in atoms else _copy(v) for v in value]
    if isinstance(value, dict):
        return {k: v if type(v) in atoms else _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [v if type(v) in atoms else _copy(v) for v in value]
    if isinstance(value, tuple):
        return tuple([v if type(v) in atoms else _copy(v) for v in value])
    return value


def copy_fields(message: BaseMessage) -> dict[str, Any]:
    """A copy of all of a message's fields, deep enough that changing one in place shows when
    it is compared with the message's ``vars`` again (at C speed, the strings shared)."""
    copied: dict[str, Any] = _copy(vars(message))
    return copied


def _getter(kind: type[BaseMessage]) -> _Getter:
    """Reads the fields an answer may depend on straight from a model's ``__dict__`` (one C
    call, as every read compares them)."""
    getter = _GETTERS.get(kind)
    if getter is None:
        names = [name for name in _FIELDS if name in kind.model_fields]
        getter = _GETTERS[kind] = operator.itemgetter(*names)
    return getter


class SameMessageMemo(Generic[V]):
    """One value per live, unchanged message object; safe to share between threads.

    ``same_objects``: the caller never changes a message in place once it was put here (it
    makes a changed copy instead, as keeper-proxy does): then the object itself is the message,
    and no copy of its fields is taken or compared."""

    def __init__(self, most: int = _MOST, *, same_objects: bool = False) -> None:
        self._most = most
        self._same_objects = same_objects
        self._known: dict[
            int, tuple[weakref.ref[BaseMessage], _Getter | None, tuple[Any, ...], V]
        ] = {}
        self._lock = threading.Lock()

    def get(self, message: BaseMessage) -> V | None:
        """The value kept for this very object, if it has not changed since; else None."""
        found = self._known.get(id(message))
        if (
            found is None
            or found[0]() is not message
            or (found[1] is not None and found[1](message.__dict__) != found[2])
        ):
            return None
        return found[3]

    def put(self, message: BaseMessage, value: V) -> None:
        """Keep ``value`` for ``message`` as it is now."""
        key = id(message)
        known = self._known

        def forget(ref: weakref.ref[BaseMessage]) -> None:
            # runs when the message is collected, in whichever thread that happens: a plain
            # dict operation (atomic), never the lock (the collector may run while it is held)
            held = known.get(key)
            if held is not None and held[0] is ref:
                known.pop(key, None)

        try:
            ref = weakref.ref(message, forget)
        except TypeError:  # an object that cannot be referenced weakly is not remembered
            return
        if len(known) >= self._most:
            with self._lock:
                if len(known) >= self._most:
                    log.debug("message memo full (%d messages): starting afresh", len(known))
                    known.clear()
        # one dict assignment (atomic): no lock needed beside the rare clearing above
        if self._same_objects:
            known[key] = (ref, None, (), value)
            return
        getter = _GETTERS.get(type(message)) or _getter(type(message))
        known[key] = (ref, getter, _copy(getter(message.__dict__)), value)

    def __len__(self) -> int:
        return len(self._known)
