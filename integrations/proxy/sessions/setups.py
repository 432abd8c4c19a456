"""Each session's model setup and the system message it renders, made once while they last.

An agent sends the same system prompt and tools on every call. The keeper's
:class:`~keeper_middleware.keeper.ModelSetup` for them (its tools converted to schemas) and the
system message every upstream call starts with are made again only when a request of the
session changes them; the same system message object on every request also lets the upstream
form of it be converted once (:class:`~.records.MessageMemo` keys on the object).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import BaseMessage, SystemMessage

from keeper_middleware.keeper import ModelSetup

__all__ = ["SessionSetups"]


class SessionSetups:
    """The last model setup of every session served, with its system message."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[ModelSetup, SystemMessage | None]] = {}

    def setup(
        self, session: str, system_prompt: str | None, tools: tuple[dict[str, Any], ...]
    ) -> ModelSetup:
        """The setup for this prompt and these tools: the session's last one when they are the
        same, else a new one (kept for the next request)."""
        known = self._known.get(session)
        if known is not None:
            setup = known[0]
            if setup.system_prompt == system_prompt and setup.tools == tools:
                return setup
        setup = ModelSetup(system_prompt=system_prompt, tools=tools)
        self._known[session] = (setup, None)
        return setup

    def render(
        self, session: str, setup: ModelSetup, window: Sequence[BaseMessage]
    ) -> list[BaseMessage]:
        """``setup.render(window)``: the messages exactly as the model receives them, led by
        the same system message object on every request of the session."""
        prompt = setup.system_prompt
        if prompt is None or (window and isinstance(window[0], SystemMessage)):
            return setup.render(window)
        known = self._known.get(session)
        head = known[1] if known is not None and known[0] is setup else None
        if head is None:
            head = SystemMessage(content=prompt)
            self._known[session] = (setup, head)
        return [head, *window]

    def forget(self, session: str) -> None:
        self._known.pop(session, None)
