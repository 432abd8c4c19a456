"""A request that only appends is taken in, rendered and answered without a message made twice:
each new message is made once with the id the session gives it, an upstream reply once with the
usage and metadata the keeper reads, a plain reply's fingerprint is taken from that reading, and
the upstream body is joined from each window message's kept JSON. Each is pinned here against
what the longer way gave (a message made, then copied; a body serialized whole), for random
messages: tool calls, content parts with images, unicode, numbers past 64 bits."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, BaseMessage

from keeper_middleware.integrations.proxy.chat_completions.replies import (
    agent_reply,
    as_received,
    read_completion,
    received_digest,
)
from keeper_middleware.integrations.proxy.chat_completions.upstream import ChatApi
from keeper_middleware.integrations.proxy.conversation.chat_messages import (
    body_json,
    message_from_openai,
    upstream_body,
)
from keeper_middleware.integrations.proxy.conversation.chat_request import parse_chat_request
from keeper_middleware.integrations.proxy.conversation.digests import digest_of
from keeper_middleware.integrations.proxy.conversation.form import WIRE_KEY, RequestError
from keeper_middleware.integrations.proxy.sessions.window_forms import WindowForms
from keeper_middleware.messages.facts import text_of
from keeper_middleware.search.schema import SEARCH_TOOL_NAME

TEXTS = st.text(alphabet=st.characters(codec="utf-8"), max_size=30)
NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70),  # past 64 bits too: written as text in a call's arguments
    st.floats(allow_nan=False, allow_infinity=False),
)
ARGUMENTS = st.one_of(
    st.dictionaries(st.sampled_from(["path", "n", "ü", "x"]), st.one_of(TEXTS, NUMBERS)).map(
        lambda args: json.dumps(args, ensure_ascii=False)
    ),
    st.sampled_from(["", "not json", "[1]", '{"n": 1e400}', '{"big": 123456789012345678901234}']),
)
CALL = st.fixed_dictionaries(
    {
        "id": st.integers(0, 99).map("call_{}".format),
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {
                "name": st.sampled_from(["read_file", "ünïcode_tool", SEARCH_TOOL_NAME]),
                "arguments": ARGUMENTS,
            }
        ),
    }
)
PART = st.one_of(
    TEXTS.map(lambda t: {"type": "text", "text": t}),
    st.sampled_from(["https://example.com/a.png", "data:image/png;base64,iVBORw0KGgo="]).map(
        lambda url: {"type": "image_url", "image_url": {"url": url, "detail": "auto"}}
    ),
)
CONTENT = st.one_of(TEXTS, st.lists(PART, min_size=1, max_size=3))
RAW = st.one_of(
    st.builds(lambda c: {"role": "user", "content": c}, CONTENT),
    st.builds(
        lambda c, calls: {"role": "assistant", "content": c, "tool_calls": calls or None},
        st.one_of(st.none(), TEXTS),
        st.lists(CALL, max_size=3),
    ),
    st.builds(
        lambda c, n: {"role": "tool", "tool_call_id": f"call_{n}", "content": c},
        CONTENT,
        st.integers(0, 99),
    ),
)


def _parsed(raw: list[dict[str, Any]]) -> Any:
    """The request's messages as the proxy reads them; None when the request is refused."""
    try:
        return parse_chat_request({"model": "m", "messages": raw}).messages
    except RequestError:
        return None


@settings(max_examples=80, deadline=None)
@given(st.lists(RAW, min_size=1, max_size=6), st.lists(st.booleans(), min_size=6, max_size=6))
def test_a_message_taken_in_is_made_once_with_its_id_as_a_copy_would_carry_it(
    raw: list[dict[str, Any]], read_first: list[bool]
) -> None:
    messages = _parsed(raw)
    if messages is None:
        return
    for index in range(len(messages)):
        if read_first[index]:  # read before (its fingerprint taken): that reading gets the id
            messages[index]
        copied = message_from_openai(raw[index], index).model_copy(update={"id": f"m{index}"})
        kept = messages.kept(index, f"m{index}")
        assert kept == copied
        assert kept.id == f"m{index}"
        assert messages[index].id is None  # the request's own reading was handed over
        assert digest_of(kept) == digest_of(messages[index])


def _completion(raw: dict[str, Any], usage: bool, wire: bool) -> dict[str, Any]:
    message = {**raw, "role": "assistant"}
    if wire:
        message[WIRE_KEY] = {"api": "responses", "items": [{"type": "message", "ü": 2**40}]}
    data: dict[str, Any] = {
        "id": "cmpl-1",
        "model": "upstream-model",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
    }
    if usage:
        data["usage"] = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    return data


def _read_the_longer_way(data: dict[str, Any]) -> AIMessage:
    """What reading a completion gave before: its message read, then copied with what the
    keeper reads beside it."""
    raw = data["choices"][0]["message"]
    message = message_from_openai({**raw, "role": "assistant"})
    assert isinstance(message, AIMessage)
    reasoning = {
        k: raw[k] for k in ("reasoning_content", "reasoning") if isinstance(raw.get(k), str)
    }
    if raw.get(WIRE_KEY) is not None:
        reasoning[WIRE_KEY] = {**raw[WIRE_KEY], "check": digest_of(message)}
    update: dict[str, Any] = {
        "additional_kwargs": reasoning,
        "response_metadata": {"finish_reason": "stop", "model_name": "upstream-model"},
    }
    if "usage" in data:
        update["usage_metadata"] = {
            "input_tokens": 7,
            "output_tokens": 3,
            "total_tokens": 10,
            "input_token_details": {"cache_read": 0},
        }
    return message.model_copy(update=update)


assistant = st.fixed_dictionaries(
    {"content": st.one_of(st.none(), TEXTS, st.lists(PART, min_size=1, max_size=2))},
    optional={
        "tool_calls": st.one_of(st.none(), st.lists(CALL, max_size=3)),
        "reasoning_content": TEXTS,
        "name": st.just("helper"),
    },
)


@settings(max_examples=120, deadline=None)
@given(
    assistant,
    st.booleans(),
    st.booleans(),
    st.sampled_from([None, SEARCH_TOOL_NAME]),
    st.sampled_from(["", "earlier text ", "<think>x</think>"]),
)
def test_a_reply_read_once_is_the_reply_read_and_copied_and_fingerprinted_alike(
    raw: dict[str, Any], usage: bool, wire: bool, hidden: str | None, carried: str
) -> None:
    data = _completion(raw, usage, wire)
    try:
        done = read_completion(data)
    except RequestError:
        with pytest.raises(RequestError):
            _read_the_longer_way(data)
        return
    assert done.reply == _read_the_longer_way(data)
    assert done.said == message_from_openai({**raw, "role": "assistant"})
    sent, _ = agent_reply(data, hidden)
    received = as_received(done, sent)
    if carried:
        received = received.model_copy(update={"content": carried + text_of(received)})
    assert received_digest(done, sent, carried) == digest_of(received)


def _window(raw: list[dict[str, Any]]) -> list[BaseMessage]:
    window = []
    for index, item in enumerate(raw):
        try:
            window.append(message_from_openai(item, index).model_copy(update={"id": f"w{index}"}))
        except RequestError:
            continue
    return window


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(RAW, min_size=1, max_size=4), min_size=1, max_size=5),
    st.dictionaries(st.sampled_from(["seed", "max_tokens", "ü"]), NUMBERS, max_size=2),
)
def test_an_appending_windows_body_is_the_whole_bodys_json_byte_for_byte(
    appends: list[list[dict[str, Any]]], extra: dict[str, Any]
) -> None:
    """Through a session that only appends, the body joined from each message's kept JSON is
    the bytes ``orjson.dumps`` gave of the body built message by message; a value orjson cannot
    hold (an integer past 64 bits among the request's fields) raises as it did."""
    api = ChatApi()
    forms = WindowForms(api.render)
    window: list[BaseMessage] = []
    params = {"model": "m", "temperature": 0.5, **extra}
    tools = ({"type": "function", "function": {"name": "read_file", "parameters": {}}},)
    for added in appends:
        window = [*window, *_window(added)]
        if not window:
            continue
        body = upstream_body(window, tools, params, {"reasoning_effort": "low"}, forms)
        before = upstream_body(window, tools, params, {"reasoning_effort": "low"}, api.render)
        try:
            expected = orjson.dumps(before)
        except orjson.JSONEncodeError:
            with pytest.raises(orjson.JSONEncodeError):
                body_json(body)
        else:
            assert body_json(body) == expected
        forms.keep(window)
