"""What the upstream reads of a session's window, converted once per message and listed once
per call.

Each window message is converted to the upstream's form once (:class:`~.records.MessageMemo`).
A window mostly grows by appending, and the keeper keeps the very same message objects from one
call to the next, so the list of forms the last call sent is kept too: when the next call's
messages start with exactly those objects (checked at C speed), that part of the list is reused
whole and only the messages after it are looked up. Anything else (a cut, an edit) is looked up
message by message, with the same result.

The list's JSON is kept beside it the same way (each form serialized once, when listed first),
so the upstream body is written from it (:class:`~..conversation.chat_messages.ListedForms`): the
chat-completions body of a window of thousands costs what its new messages cost to serialize.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import is_
from typing import Any

from langchain_core.messages import BaseMessage

from keeper_middleware.integrations.proxy.conversation.chat_messages import (
    ListedForms,
    joined_forms,
)
from keeper_middleware.integrations.proxy.sessions.records import MessageMemo

__all__ = ["WindowForms"]


class WindowForms(MessageMemo):
    """A :class:`~.records.MessageMemo` that also keeps the last list of forms it gave, and
    their JSON."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._last: tuple[list[BaseMessage], list[dict[str, Any]], bytes | None] = ([], [], b"")

    def many(self, messages: Sequence[BaseMessage]) -> ListedForms:
        """``[self(m) for m in messages]``, the part the last call's list holds reused whole
        (and its JSON: only the forms after it are serialized)."""
        last, forms, joined = self._last
        if last and len(messages) >= len(last) and all(map(is_, messages, last)):
            added = list(map(self, messages[len(last) :]))
            listed = [*forms, *added]
        else:
            added = listed = list(map(self, messages))
            joined = b""
        joined = joined_forms(joined, added)
        self._last = (list(messages), listed, joined)
        return ListedForms(listed, joined)  # the caller's own list: the kept one never changes
