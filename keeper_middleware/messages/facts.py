"""Small, pure facts about LangChain messages that every part of the keeper needs.

Keeper-authored messages carry ``additional_kwargs["keeper"]`` (see docs/formats.md), so code
never has to sniff their text.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Sequence
from itertools import repeat
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from keeper_middleware.messages.blocks import content_as_text

KEEPER_KEY = "keeper"
_THINK_BLOCK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)
_REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")


def as_ai_message(message: BaseMessage) -> AIMessage:
    """A chat model's reply as an ``AIMessage`` (some runnables hand back a plain message)."""
    if isinstance(message, AIMessage):
        return message
    return AIMessage(content=message.content, id=message.id)


def keeper_kind(message: BaseMessage) -> str | None:
    """The kind of a keeper-authored message ("notes", "rules", ...), or None for anyone else's."""
    kind = message.additional_kwargs.get(KEEPER_KEY)
    return kind if isinstance(kind, str) else None


_EXTRA = operator.attrgetter("additional_kwargs")


def kind_positions(messages: Sequence[BaseMessage], kind: str, start: int = 0) -> list[int]:
    """The indices (from ``start``) of the messages whose :func:`keeper_kind` is ``kind``.

    A step asks where the NOTES are several times over a window of thousands of messages:
    the tags are read and searched at C speed (``list.index``), not one Python call per
    message; the answer is the one :func:`keeper_kind` gives message by message."""
    try:
        tags = list(map(dict.get, map(_EXTRA, messages[start:]), repeat(KEEPER_KEY)))
    except TypeError:  # ``additional_kwargs`` that is not a plain dict
        tags = [m.additional_kwargs.get(KEEPER_KEY) for m in messages[start:]]
    found: list[int] = []
    at = 0
    while True:
        try:
            at = tags.index(kind, at)
        except ValueError:
            return found
        if isinstance(tags[at], str):
            found.append(start + at)
        at += 1


def first_of_kind(messages: Sequence[BaseMessage], kind: str) -> int | None:
    """The index of the first message whose :func:`keeper_kind` is ``kind``, or None."""
    found = kind_positions(messages, kind)
    return found[0] if found else None


def is_keeper_message(message: BaseMessage) -> bool:
    """Whether the keeper wrote this message into the graph's messages: the NOTES after a cut,
    the RULES after a question, retrieved passages (all user-role messages the model must read).

    A chat UI that shows ``stream_mode="messages"`` or a thread's state filters these out, so
    the user never sees the keeper's notes as if they had written them; the marker is
    ``additional_kwargs["keeper"]`` (the kind, a string), which the keeper writes on every such
    message and removes from any message it did not write (docs/branches.md, "Chat UIs").

    Args:
        message: any message of the graph's state or stream.

    Example:
        .. code-block:: python

            for chunk, meta in agent.stream(inputs, config, stream_mode="messages"):
                if not is_keeper_message(chunk):
                    show(chunk)
    """
    return keeper_kind(message) is not None


def keeper_message(text: str, kind: str, *, msg_id: str | None = None) -> HumanMessage:
    """A user-role message written by the keeper, tagged so it is recognised later."""
    return HumanMessage(content=text, additional_kwargs={KEEPER_KEY: kind}, id=msg_id)


def text_of(message: BaseMessage) -> str:
    """The text of a message: string content as it is, list content with every block as text
    (:func:`~keeper_middleware.messages.blocks.content_as_text`: text word for word, tool calls and
    results and JSON as text, an image or a file as a placeholder; reasoning kept apart)."""
    return content_as_text(message.content)


def role_of(message: BaseMessage) -> str:
    """ "system", "human", "ai" or "tool" (anything else by its LangChain type)."""
    return message.type


def is_input(message: BaseMessage) -> bool:
    """A user message that is not the keeper's own."""
    return isinstance(message, HumanMessage) and keeper_kind(message) is None


def reasoning_of(message: BaseMessage) -> str:
    """Reasoning text a reply carried, wherever the provider put it."""
    found: list[str] = []
    extra = message.additional_kwargs
    for key in _REASONING_KEYS if extra else ():
        value = extra.get(key)
        if isinstance(value, str) and value:
            found.append(value)
    if isinstance(message.content, str):
        if "<think>" in message.content:  # a block needs its opening tag
            found.extend(m.group(0) for m in _THINK_BLOCK.finditer(message.content))
    else:
        for part in message.content:
            if isinstance(part, dict) and part.get("type") in ("reasoning", "thinking"):
                found.append(str(part.get("reasoning") or part.get("thinking") or ""))
    stored = message.response_metadata.get("keeper_reasoning")
    if isinstance(stored, str) and stored:
        found.append(stored)
    return "\n".join(found)


def strip_reasoning(message: AIMessage) -> AIMessage:
    """A copy of a reply without its reasoning; the reasoning moves to response_metadata.

    The history carrying every reply's reasoning grew to ~215K tokens in a measured run; what the
    model reads again must not carry it. It is kept (not sent) so the archive can store it.
    """
    reasoning = reasoning_of(message)
    if not reasoning:
        return message
    kwargs = {k: v for k, v in message.additional_kwargs.items() if k not in _REASONING_KEYS}
    content: Any = message.content
    if isinstance(content, str):
        content = _THINK_BLOCK.sub("", content)
    else:
        content = [
            p
            for p in content
            if not (isinstance(p, dict) and p.get("type") in ("reasoning", "thinking"))
        ]
    metadata = {**message.response_metadata, "keeper_reasoning": reasoning}
    return message.model_copy(
        update={"content": content, "additional_kwargs": kwargs, "response_metadata": metadata}
    )


def thought_to_limit(message: BaseMessage) -> bool:
    """A reply that spent its whole budget thinking and wrote nothing."""
    if not isinstance(message, AIMessage) or message.tool_calls or text_of(message).strip():
        return False
    reason = message.response_metadata.get("finish_reason") or message.response_metadata.get(
        "stop_reason"
    )
    return reason in ("length", "max_tokens")


def is_empty_reply(message: BaseMessage) -> bool:
    """A reply with neither text nor a tool call (not even one that ran out of tokens)."""
    return (
        isinstance(message, AIMessage)
        and not message.tool_calls
        and not text_of(_strip_think(message)).strip()
        and not thought_to_limit(message)
    )


def is_final_answer(message: BaseMessage) -> bool:
    """An AI reply with something to say and no tool calls: it answers what came before."""
    return (
        isinstance(message, AIMessage)
        and not message.tool_calls
        and bool(text_of(_strip_think(message)).strip())
    )


def _strip_think(message: BaseMessage) -> BaseMessage:
    if isinstance(message, AIMessage):
        return strip_reasoning(message)
    return message


def safe_boundary(messages: Sequence[BaseMessage], index: int) -> int:
    """The nearest index <= ``index`` where a cut splits no tool call from its results.

    Providers reject a tool result whose call is gone (and a call whose result is missing), so an
    AI message with tool calls and its ToolMessages always leave the window together.
    """
    index = max(0, min(index, len(messages)))
    while 0 < index < len(messages) and isinstance(messages[index], ToolMessage):
        index -= 1
    # the message before the boundary may be an AI call whose results lie beyond it
    if 0 < index <= len(messages):
        before = messages[index - 1]
        if isinstance(before, AIMessage) and before.tool_calls:
            return safe_boundary(messages, index - 1)
    return index


def system_of(messages: Sequence[BaseMessage]) -> SystemMessage | None:
    """The system message at the head of a conversation, if it has one."""
    return messages[0] if messages and isinstance(messages[0], SystemMessage) else None


UNANSWERED_CALL_TEXT = (
    "Not run: this tool call got no result (the run stopped before the tool ran, or its result "
    "was lost). Call the tool again if you still need it."
)


def close_unanswered_calls(
    messages: Sequence[BaseMessage],
) -> tuple[list[BaseMessage], int]:
    """The messages with a synthetic result after every tool call that has none, and how many.

    Providers answer 400 to a request that carries a tool call without its result, and a graph
    stopped by its recursion limit (or a crash, or a user's own graph) leaves exactly that. The
    result is placed right after the call's other results, so the pair is whole again.
    """
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    call_ids = {
        call.get("id")
        for m in messages
        if isinstance(m, AIMessage) and (m.tool_calls or m.invalid_tool_calls)
        for call in (*m.tool_calls, *m.invalid_tool_calls)
    }
    call_ids.discard(None)
    call_ids.discard("")
    if call_ids <= answered:  # every call answered (each step's usual case)
        return list(messages), 0
    result: list[BaseMessage] = []
    added = 0
    pending: list[tuple[str, str]] = []

    def flush() -> None:
        nonlocal added
        for call_id, name in pending:
            result.append(
                ToolMessage(
                    content=UNANSWERED_CALL_TEXT,
                    tool_call_id=call_id,
                    name=name,
                    id=f"unanswered-{call_id}",
                    status="error",
                )
            )
            added += 1
        pending.clear()

    for message in messages:
        if pending and not isinstance(message, ToolMessage):
            flush()
        result.append(message)
        if isinstance(message, AIMessage):
            # a call whose arguments did not parse is sent to the provider all the same
            calls = [*message.tool_calls, *message.invalid_tool_calls]
            pending.extend(
                (str(call["id"]), str(call.get("name") or ""))
                for call in calls
                if call.get("id") and call["id"] not in answered
            )
    flush()
    return result, added


_SAFE_INT = 2**63 - 1


def storable_args(value: Any) -> Any:
    """Tool-call arguments a checkpointer can store: a whole number beyond 64 bits and a float
    that is not finite become their text, a lone surrogate its escape (msgpack refuses them,
    and a graph whose checkpoint cannot be written loses the whole step); the tool then
    refuses a bad number by name."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if -_SAFE_INT <= value <= _SAFE_INT else str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): storable_args(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [storable_args(v) for v in value]
    return value


def with_storable_calls(message: AIMessage) -> AIMessage:
    """``message`` with every tool call's arguments made storable (the same object if they were)."""
    if not message.tool_calls:
        return message
    calls = [{**call, "args": storable_args(call["args"])} for call in message.tool_calls]
    if calls == list(message.tool_calls):
        return message
    return message.model_copy(update={"tool_calls": calls})


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def storable_text(text: str) -> str:
    """``text`` as UTF-8 can store it: a lone surrogate (not a character of any script, but
    models and clients send them) is written as its escape, ``\\udXXX``; all else is kept."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    return text
