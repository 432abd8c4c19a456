"""What the upstream reads of a session's window, converted once per message and listed once
per call.

Each window message is converted to the upstream's form once (:class:`~.records.MessageMemo`).
A window mostly grows by appending, and the keeper keeps the very same message objects from one
call to the next, so the list of forms the last call sent is kept too: when the next call's
messages start with exactly those objects (checked at C speed), that part of the list is reused
whole and only the messages after it are looked up. Anything else (a cut, an edit) is looked up
message by message, with the same result.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import is_
from typing import Any

from langchain_core.messages import BaseMessage

from keeper_middleware.integrations.proxy.sessions.records import MessageMemo

__all__ = ["WindowForms"]


class WindowForms(MessageMemo):
    """A :class:`~.records.MessageMemo` that also keeps the last list of forms it gave."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._last: tuple[list[BaseMessage], list[dict[str, Any]]] = ([], [])

    def many(self, messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
        """``[self(m) for m in messages]``, the part the last call's list holds reused whole."""
        last, forms = self._last
        if last and len(messages) >= len(last) and all(map(is_, messages, last)):
            listed = [*forms, *map(self, messages[len(last) :])]
        else:
            listed = list(map(self, messages))
        self._last = (list(messages), listed)
        return list(listed)  # the caller's own list: the kept one never changes
