"""How the keeper's caller reaches the model: the system prompt and tools every call carries,
and the shape of the call the keeper is handed for its note requests.

Kept apart from the engine so adapters, arms and the benchmark can describe a model call
without importing the engine's decisions.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, SystemMessage
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool

NoteCall = Callable[[list[BaseMessage], Mapping[str, Any]], AIMessage]
"""A note request sent to the model (sync): the messages and the call kwargs."""
AsyncNoteCall = Callable[[list[BaseMessage], Mapping[str, Any]], Awaitable[AIMessage]]
"""A note request sent to the model (async)."""
Tool = BaseTool | Callable[..., Any] | dict[str, Any]
"""A tool as LangChain accepts it: a tool object, a function, or an OpenAI-style schema."""


@dataclass(frozen=True, slots=True)
class ModelSetup:
    """How the model is called. Work calls and note calls share it, so a note call renders
    exactly like a normal call and the server's prefix cache serves it (2–4% cache hits before
    this was so, 91% after, measured)."""

    system_prompt: str | None = None
    """The system prompt every call carries (None: none of the keeper's own)."""
    tools: tuple[Tool, ...] = ()
    """The tools every call binds: the user's and the archive search."""
    _schemas: tuple[dict[str, Any], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # converted once: every step counts the request several times, and converting a tool
        # (LangChain resolves its JSON schema) cost more than the rest of counting it (measured
        # along a 10M-token stream: 4 conversions a step, 3-5% of the keeper's CPU)
        schemas = tuple(convert_to_openai_tool(t) for t in self.tools)  # type: ignore[arg-type]
        object.__setattr__(self, "_schemas", schemas)

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        return list(self._schemas)

    def render(self, messages: Sequence[BaseMessage]) -> list[BaseMessage]:
        """The messages exactly as the model receives them."""
        if self.system_prompt is None or (messages and isinstance(messages[0], SystemMessage)):
            return list(messages)
        return [SystemMessage(content=self.system_prompt), *messages]
