"""An offline, scripted chat model for examples and for your own tests of a keeper agent.

``ScriptedChatModel`` answers from a script, one entry per call: an ``AIMessage``, a string, or a
function of the messages it was sent (for replies that depend on them, such as the keeper's note
requests). ``bind_tools`` returns a copy that records the tools' names and writes into the same
``received`` log, so a test can assert exactly what the keeper sent (messages, tools, keyword
arguments), as langgraph's ``FakeToolCallingModel`` and pydantic-ai's ``received_messages`` do.
``tool_call`` builds a reply that calls a tool::

    from keeper_middleware.testing import ScriptedChatModel, tool_call

    model = ScriptedChatModel(
        script=[tool_call("search_archive", query="domo03"), "1. 9"],
        default="Noted.",
    )
    agent = create_keeper_agent(model, ...)
    ...
    assert model.received[-1].tools == ["search_archive"]

Token counts come from ``count_tokens_approximately``, so ``token_counter=model`` works offline.
Nothing here reaches a network.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.messages.utils import count_tokens_approximately
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from pydantic import ConfigDict, Field

from keeper_middleware.errors import ArgumentTypeError, InvalidStateError

__all__ = ["Received", "Reply", "ScriptedChatModel", "tool_call"]

log = logging.getLogger(__name__)

Reply = AIMessage | str | Callable[[list[BaseMessage]], "AIMessage | str"]
"""One script entry: a message, a text, or a function of the messages sent."""


@dataclass
class Received:
    """One call as the model received it."""

    messages: list[BaseMessage]
    """Every message sent, in order (the keeper's NOTES and injections included)."""
    tools: list[str]
    """The names of the tools bound for the call."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments bound or passed (``tool_choice``, thinking settings, ...)."""


def tool_call(name: str, /, **args: Any) -> AIMessage:
    """A reply that calls one tool.

    Args:
        name: the tool's name (``"search_archive"`` for the keeper's archive search).
        **args: the tool's arguments.

    Returns:
        An ``AIMessage`` with one tool call, whose id is derived from the call, so a rerun of
        the same script sends the same ids.
    """
    digest = hashlib.sha256(json.dumps([name, args], sort_keys=True).encode()).hexdigest()
    return AIMessage(
        content="",
        tool_calls=[{"name": name, "args": args, "id": f"call-{digest[:12]}", "type": "tool_call"}],
    )


def _tool_name(tool: Any) -> str:
    if isinstance(tool, dict):
        return str(tool.get("name") or tool.get("function", {}).get("name") or "?")
    return str(getattr(tool, "name", None) or getattr(tool, "__name__", "?"))


class ScriptedChatModel(BaseChatModel):
    """A chat model that replies from a script and records every call.

    It takes its fields as keyword arguments (``ScriptedChatModel(script=[...], default=...)``).

    Attributes:
        script: replies in call order; each is used once.
        default: the reply once the script has run out (None: running out is an error).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    script: list[Any] = Field(default_factory=list, repr=False)
    """Replies in call order (``Reply`` entries); each is used once."""
    default: Any = None
    """The reply once ``script`` has run out; None makes running out an error."""
    received: list[Received] = Field(default_factory=list, repr=False)
    """Every call, in order, shared with the copies ``bind_tools`` makes."""
    bound_tools: list[str] = Field(default_factory=list)
    """The names of the tools this copy was bound with."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """A copy bound with ``tools`` (their names recorded) that writes into the same log.

        Args:
            tools: LangChain tools, functions or OpenAI-style schemas.
            tool_choice: bound with the copy and recorded with each call, when given.
            **kwargs: bound with the copy and recorded with each call.
        """
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        clone = self.model_copy(update={"bound_tools": [_tool_name(t) for t in tools]})
        clone.received = self.received  # one log for the model and its bound copies
        clone.script = self.script
        return clone.bind(**kwargs) if kwargs else clone

    def get_num_tokens_from_messages(
        self, messages: list[BaseMessage], tools: Sequence[Any] | None = None
    ) -> int:
        """LangChain's approximate count (no tokenizer to download)."""
        return count_tokens_approximately(messages, tools=list(tools) if tools else None)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.received.append(Received(list(messages), list(self.bound_tools), dict(kwargs)))
        entry = self.script.pop(0) if self.script else self.default
        if entry is None:
            raise InvalidStateError(
                f"the script ran out after {len(self.received)} calls; give more replies "
                "or a default"
            )
        reply: object = entry(list(messages)) if callable(entry) else entry
        if isinstance(reply, str):
            reply = AIMessage(content=reply)
        if not isinstance(reply, AIMessage):
            raise ArgumentTypeError(
                f"a script entry must be an AIMessage, a str, or a function of the messages "
                f"returning one; call {len(self.received)} got {type(reply).__name__}"
            )
        return ChatResult(generations=[ChatGeneration(message=reply)])
