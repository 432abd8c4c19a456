"""The content's own numbering: which item (batch, ticket) each new input is.

Search results and notes count only in these numbers, never in message indices: mixing the two
numberings cost a measured run thirteen answers.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from langchain_core.messages import BaseMessage, ToolMessage

from keeper_middleware.messages import is_input, text_of


class ItemNumbering:
    """Gives each new input its item number: the one it states, or the next one."""

    __slots__ = ("_pattern", "_tools")

    def __init__(self, pattern: str | None, item_tools: Sequence[str] = ()) -> None:
        self._pattern = re.compile(pattern, re.MULTILINE) if pattern else None
        self._tools = frozenset(item_tools)

    def is_new_input(self, message: BaseMessage) -> bool:
        """A user message, or the result of a tool that delivers new inputs."""
        if is_input(message):
            return True
        return isinstance(message, ToolMessage) and message.name in self._tools

    def stated_number(self, message: BaseMessage) -> int | None:
        if self._pattern is None:
            return None
        match = self._pattern.search(text_of(message))
        return int(match.group(1)) if match else None

    def number(self, message: BaseMessage, last_item: int) -> int:
        """The item a new input starts: its stated number, else the one after ``last_item``."""
        stated = self.stated_number(message)
        return stated if stated is not None else last_item + 1
