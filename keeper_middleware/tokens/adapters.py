"""LangChain's ways of counting tokens behind the keeper's ``TokenCounter`` protocol.

LangChain's ``trim_messages(token_counter=...)`` takes a function from messages to a count (such as
``langchain_core.messages.utils.count_tokens_approximately``) or a chat model (whose
``get_num_tokens_from_messages`` counts with the model's own tokenizer). ``token_counter=`` takes
the same two, so a user does not learn a second dialect; ``resolve_token_counter`` wraps them here.

Both count messages only. A text on its own is counted as a message holding it, less an empty
message (the per-message overhead), so the NOTES budget and the room each message takes use the
same tokenizer as the request. Tools are passed to the counter when it takes a ``tools`` argument
(both of LangChain's do); otherwise their JSON schemas are counted as text.
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage

__all__ = ["ChatModelTokenCounter", "MessagesTokenCounter"]

log = logging.getLogger(__name__)

CountMessages = Callable[..., int]
"""``(messages) -> int``, optionally with a ``tools=`` keyword (``count_tokens_approximately``)."""


def _takes_tools(count: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(count).parameters
    except (TypeError, ValueError):
        return False
    return "tools" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )


class MessagesTokenCounter:
    """A function from messages to a token count, as LangChain's ``trim_messages`` takes one.

    Args:
        count: ``(messages) -> int``; given ``tools=`` too when its signature takes it.
        name: what ``repr`` shows (the function's name by default).
    """

    def __init__(self, count: CountMessages, *, name: str | None = None) -> None:
        self._count = count
        self._takes_tools = _takes_tools(count)
        self._name = name or getattr(count, "__qualname__", type(count).__qualname__)
        self._empty: int | None = None

    def count_messages(
        self, messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]] = ()
    ) -> int:
        """The request's count: the messages and, when there are any, the tool schemas."""
        if self._takes_tools and tools:
            return int(self._count(list(messages), tools=list(tools)))
        total = int(self._count(list(messages)))
        if tools:
            total += self.count_text(json.dumps(list(tools), ensure_ascii=False))
        return total

    def count_text(self, text: str) -> int:
        """A text's count: a message holding it, less an empty message's overhead."""
        if self._empty is None:
            self._empty = int(self._count([HumanMessage("")]))
        return max(0, int(self._count([HumanMessage(text)])) - self._empty)

    def __repr__(self) -> str:
        return f"MessagesTokenCounter({self._name})"


class ChatModelTokenCounter(MessagesTokenCounter):
    """A chat model's own count (``get_num_tokens_from_messages``), as ``trim_messages`` uses it.

    Args:
        model: a LangChain chat model; its tokenizer must be available offline (many of
            LangChain's fall back to a tokenizer they download on first use).
    """

    def __init__(self, model: Any) -> None:
        super().__init__(model.get_num_tokens_from_messages, name=type(model).__name__)
        self.model = model

    def __repr__(self) -> str:
        return f"ChatModelTokenCounter({type(self.model).__name__})"
