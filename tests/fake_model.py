"""A scripted chat model for tests: replies are scripted per call, and every request is recorded.

Like langgraph's ``FakeToolCallingModel``: ``bind_tools`` returns a bound copy that still records
into the same log, so a test can assert exactly what the keeper sent (messages, tools, kwargs).
A script entry is an ``AIMessage``, a string, or a callable ``(messages) -> AIMessage | str`` for
replies that depend on what was sent (the note requests, for example).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from pydantic import ConfigDict, Field

Reply = AIMessage | str | Callable[[list[BaseMessage]], "AIMessage | str"]


@dataclass
class Received:
    messages: list[BaseMessage]
    tools: list[str]
    kwargs: dict[str, Any] = field(default_factory=dict)


class ScriptedChatModel(BaseChatModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    script: list[Any] = Field(default_factory=list, repr=False)
    """Replies in order; when it runs out, ``default`` answers."""
    default: Any = None
    received: list[Received] = Field(default_factory=list, repr=False)
    bound_tools: list[str] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Runnable[Any, BaseMessage]:
        names = []
        for tool in tools:
            name = (
                getattr(tool, "name", None)
                or (tool.get("function", {}).get("name") if isinstance(tool, dict) else None)
                or getattr(tool, "__name__", "?")
            )
            names.append(name)
        clone = self.model_copy(update={"bound_tools": names})
        clone.received = self.received  # share the log
        clone.script = self.script
        return clone.bind(**kwargs) if kwargs else clone

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
            raise AssertionError(f"script exhausted after {len(self.received)} calls")
        reply = entry(list(messages)) if callable(entry) else entry
        message = AIMessage(content=reply) if isinstance(reply, str) else reply
        return ChatResult(generations=[ChatGeneration(message=message)])
