"""The proxy writes a plain message's upstream form itself: exactly what LangChain writes."""

from __future__ import annotations

import json

import pytest
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    convert_to_openai_messages,
)

from keeper_middleware.integrations.proxy.conversation.chat_messages import message_to_openai
from keeper_middleware.integrations.proxy.conversation.plain_forms import plain_form

PLAIN: list[BaseMessage] = [
    HumanMessage("what is in the archive?", id="u1"),
    HumanMessage("", id="u2"),
    HumanMessage("héllo – 日本語 \U0001f600", name="alice"),
    AIMessage("the answer", id="a1"),
    AIMessage(
        "",
        tool_calls=[
            {"name": "read", "args": {"path": "a/b.txt", "n": 3}, "id": "c1", "type": "tool_call"},
            {"name": "note", "args": {"text": "naïve ✓", "tags": ["x", 1.5, None]}, "id": "c2"},
        ],
    ),
    AIMessage("I checked.", tool_calls=[{"name": "ls", "args": {}, "id": "c3"}], name="bot"),
    AIMessage("", additional_kwargs={"refusal": "I cannot help with that."}),
    AIMessage("kept", additional_kwargs={"refusal": "", "other": 1}),
    ToolMessage("file contents", tool_call_id="c1"),
    ToolMessage("", tool_call_id="c2", name="note"),
]


@pytest.mark.parametrize("message", PLAIN, ids=lambda m: f"{m.type}:{m.content[:12]!r}")
def test_a_plain_message_is_written_as_langchain_writes_it(message: BaseMessage) -> None:
    expected = convert_to_openai_messages(message, text_format="string")
    written = plain_form(message)
    assert written == expected
    # the same bytes upstream: key order and argument text included
    assert json.dumps(written) == json.dumps(expected)


@pytest.mark.parametrize(
    "message",
    [
        SystemMessage("be brief", additional_kwargs={"__openai_role__": "developer"}),
        HumanMessage([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]),
        AIMessageChunk(content="a chunk"),
    ],
    ids=["system", "content-blocks", "subclass"],
)
def test_any_other_message_is_left_to_langchain(message: BaseMessage) -> None:
    assert plain_form(message) is None
    assert message_to_openai(message) == convert_to_openai_messages(message, text_format="string")
