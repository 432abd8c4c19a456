"""The chat-completions upstream body is written by joining each window message's kept JSON
(``ListedForms``, ``body_json``): byte for byte what serializing the whole body gives, through
any sequence of appends, edits, regenerates, truncations and resends of an earlier window."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from keeper_middleware.integrations.proxy.chat_completions.upstream import ChatApi
from keeper_middleware.integrations.proxy.conversation.chat_messages import (
    ListedForms,
    body_json,
    upstream_body,
)
from keeper_middleware.integrations.proxy.sessions.window_forms import WindowForms

TOOLS = ({"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}},)
PARAMS = {"model": "m", "temperature": 0.2, "messages": "the client's, replaced"}
TEXTS = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)

message = st.one_of(
    TEXTS.map(lambda t: ("user", t)),
    TEXTS.map(lambda t: ("reply", t)),
    TEXTS.map(lambda t: ("tools", t)),
)
operation = st.one_of(
    st.tuples(st.just("append"), st.lists(message, min_size=1, max_size=4)),
    st.tuples(st.just("edit"), st.integers(0, 99), TEXTS),
    st.tuples(st.just("regenerate"), TEXTS),
    st.tuples(st.just("truncate"), st.integers(1, 5)),
    st.tuples(st.just("resend"), st.integers(0, 99)),
)


def _messages(kind: str, text: str, number: int) -> list[BaseMessage]:
    if kind == "user":
        return [HumanMessage(text, id=f"u-{number}")]
    if kind == "reply":
        return [AIMessage(text, id=f"r-{number}")]
    call = {"name": "read", "args": {"what": text, "n": number}, "id": f"c-{number}"}
    return [
        AIMessage("", id=f"a-{number}", tool_calls=[call]),
        ToolMessage(text, tool_call_id=f"c-{number}", id=f"t-{number}"),
    ]


def _apply(
    window: list[BaseMessage], earlier: list[list[BaseMessage]], op: tuple[Any, ...], n: int
) -> list[BaseMessage]:
    kind = op[0]
    if kind == "append":
        return [*window, *(m for i, (k, t) in enumerate(op[1]) for m in _messages(k, t, n + i))]
    if kind == "edit" and window:
        at = op[1] % len(window)
        edited = window[at].model_copy(update={"content": op[2]})
        return [*window[:at], edited, *window[at + 1 :]]
    if kind == "regenerate" and window and isinstance(window[-1], AIMessage):
        return [*window[:-1], AIMessage(op[1], id=f"again-{n}")]
    if kind == "truncate":
        return window[: max(0, len(window) - op[1])]
    if kind == "resend" and earlier:
        return list(earlier[op[1] % len(earlier)])
    return window


def _whole(body: dict[str, Any]) -> bytes:
    """The body serialized as it was before: every form, a plain list."""
    return orjson.dumps({**body, "messages": list(body["messages"])})


@settings(max_examples=60, deadline=None)
@given(st.lists(operation, min_size=1, max_size=12))
def test_the_joined_body_is_the_serialized_body_byte_for_byte(ops: list[tuple[Any, ...]]) -> None:
    forms = WindowForms(ChatApi().render)
    window: list[BaseMessage] = [HumanMessage("Read everything.", id="task")]
    earlier: list[list[BaseMessage]] = []
    kwargs = {"reasoning_effort": "low", "extra_body": {"top_k": 20}}
    for number, op in enumerate(ops):
        window = _apply(window, earlier, op, number * 10)
        earlier.append(window)
        body = upstream_body(window, TOOLS, PARAMS, kwargs, forms)
        assert type(body["messages"]) is ListedForms
        assert body["messages"].json() is not None  # joined, not serialized again
        assert body_json(body) == _whole(body) == orjson.dumps(body)
        streaming = {**body, "stream": True, "stream_options": {"include_usage": True}}
        assert body_json(streaming) == _whole(streaming)
        forms.keep(window)


def test_a_list_changed_after_it_was_listed_is_serialized_as_it_stands() -> None:
    forms = WindowForms(ChatApi().render)
    window: list[BaseMessage] = [HumanMessage("a", id="1"), AIMessage("b", id="2")]
    for change in ("append", "replace", "remove"):
        body = upstream_body(window, TOOLS, PARAMS, {}, forms)
        listed = body["messages"]
        if change == "append":
            listed.append({"role": "user", "content": "added"})
        elif change == "replace":
            listed[0] = {"role": "user", "content": "replaced"}
        else:
            del listed[-1]
        assert listed.json() is None
        assert body_json(body) == _whole(body)


def test_a_form_that_json_cannot_hold_raises_as_serializing_it_does() -> None:
    def render(message: BaseMessage) -> dict[str, Any]:
        return {"role": "user", "content": {1, 2}}  # a set

    body = upstream_body([HumanMessage("a", id="1")], (), {}, {}, WindowForms(render))
    for serialize in (body_json, orjson.dumps):
        try:
            serialize(body)
        except orjson.JSONEncodeError as error:
            assert "set" in str(error)
        else:
            raise AssertionError("serialized a set")
