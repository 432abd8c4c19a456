"""The keeper proxy with a real llama.cpp model server in the loop.

The model is SmolLM2-135M-Instruct. It cannot answer or keep notes (its note replies are mostly
malformed), so these tests pin what the proxy does around a real server: cuts within the window
as the server counts it, note calls that reuse the prefix the server already holds (read from the
server's own usage), malformed notes caught by the checks, bounded requests, and conversations
and a forced tool call from real OpenAI and LangChain clients. They never assert answer content.
Every request has a timeout and ``max_tokens`` <= 64.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.real_llama import (
    CHATML_REPLY_TOKENS,
    TIMEOUT,
    counter_fixture,  # noqa: F401
    require_llama,
    server_fixture,  # noqa: F401
)

pytestmark = pytest.mark.real_server
require_llama()

import httpx  # noqa: E402
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from openai import OpenAI  # noqa: E402

from keeper_middleware.config import KeeperConfig  # noqa: E402
from keeper_middleware.integrations.proxy import RetryPolicy, create_proxy_app  # noqa: E402
from keeper_middleware.integrations.proxy.chat_completions.streams import StreamAssembler  # noqa: E402
from keeper_middleware.integrations.proxy.cli import serve_in_thread  # noqa: E402
from keeper_middleware.integrations.proxy.conversation.chat_messages import message_from_openai  # noqa: E402
from keeper_middleware.integrations.proxy.sessions.tenants import (  # noqa: E402
    DEFAULT_TENANT,
    SESSION_HEADER,
    stored_name,
)
from keeper_middleware.notes.block import (  # noqa: E402
    NOTES_CHECK_TAG,
    NOTES_REQUEST_TAG,
    parse_notes,
    render_notes,
)

MAX_TOKENS = 24
WINDOW = 1280  # room for the fixed part: tools, the NOTES at their budget, a note request
RESERVE = 128
SYSTEM = "You keep count of the lamps in each hall."
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def _reply_of(response: httpx.Response, content: bytes) -> dict[str, Any]:
    """The completion, whether the server answered in JSON or (to a streaming proxy) in SSE."""
    if "text/event-stream" not in response.headers.get("content-type", ""):
        return json.loads(content)
    assembler = StreamAssembler()
    for line in content.decode().splitlines():
        if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
            assembler.feed(json.loads(line[5:]))
    return assembler.completion()


class RecordingTransport(httpx.AsyncBaseTransport):
    """Passes the proxy's upstream calls to the server and keeps each request and reply body."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.exchanges: list[tuple[dict[str, Any], dict[str, Any]]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        content = await response.aread()
        if request.method == "POST" and response.status_code == 200:
            self.exchanges.append((json.loads(request.content), _reply_of(response, content)))
        headers = {k: v for k, v in response.headers.items() if k.lower() != "transfer-encoding"}
        return httpx.Response(response.status_code, headers=headers, content=content)

    async def aclose(self) -> None:
        await self.inner.aclose()

    def calls_of(self, session_system: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        return [(b, r) for b, r in self.exchanges if b["messages"][0]["content"] == session_system]


def is_note_call(body: dict[str, Any]) -> bool:
    last = str(body["messages"][-1].get("content") or "")
    return last.startswith((NOTES_REQUEST_TAG, NOTES_CHECK_TAG))


@pytest.fixture(scope="module")
def proxy(server, counter, tmp_path_factory):
    """The keeper proxy in front of the server, with a small window and the server's own counts."""
    transport = RecordingTransport()
    config = KeeperConfig(window=WINDOW, reply_reserve=RESERVE, notes_every_items=None)
    app = create_proxy_app(
        server.base_url,
        window=WINDOW,
        archive_dir=tmp_path_factory.mktemp("proxy"),
        config=config,
        retry=RetryPolicy(timeout=TIMEOUT),
        token_counter=counter,
        transport=transport,
    )
    with serve_in_thread(app) as url:
        yield url, app.state.proxy, transport


LONG_SESSION = stored_name(DEFAULT_TENANT, "long")
"""How the proxy stores the conversation named "long" by a caller without a key."""


def client_for(url: str, session: str) -> OpenAI:
    return OpenAI(
        base_url=url,
        api_key="unused",
        timeout=TIMEOUT,
        max_retries=0,
        default_headers={SESSION_HEADER: session},
    )


def item(number: int) -> str:
    """About 100 tokens; nothing in it depends on the model."""
    counts = " ".join(
        f"The clerk counted {number * 7 + hall} lamps in hall h{hall}." for hall in range(8)
    )
    return f"Item {number}: {counts}"


@pytest.fixture(scope="module")
def long_conversation(server, proxy):
    """One conversation through the proxy, long enough for a cut; turns alternate between a
    plain and a streamed request. Returns the replies as the agent saw them."""
    url, _, _ = proxy
    client = client_for(url, "long")
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    replies: list[dict[str, Any]] = []
    for number in range(1, 10):
        messages.append({"role": "user", "content": item(number)})
        common = {"model": server.model_alias, "messages": messages, "max_tokens": MAX_TOKENS}
        if number % 2:
            reply = client.chat.completions.create(**common, temperature=0)
            text, usage = reply.choices[0].message.content, reply.usage
        else:
            stream = client.chat.completions.create(
                **common, temperature=0, stream=True, stream_options={"include_usage": True}
            )
            chunks = list(stream)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            usage = chunks[-1].usage
        replies.append({"text": text, "usage": usage, "streamed": not number % 2})
        messages.append({"role": "assistant", "content": text})
        if proxy[1].keeper.counters(LONG_SESSION).cuts and number >= 6:
            break
    return replies


@pytest.mark.timeout(900)
def test_a_long_conversation_is_answered_turn_by_turn_streamed_or_not(long_conversation):
    assert {reply["streamed"] for reply in long_conversation} == {True, False}
    for reply in long_conversation:
        assert isinstance(reply["text"], str)
        assert reply["usage"] is not None  # the turn's upstream calls summed (one call's cap:
        assert reply["usage"].completion_tokens >= 1  # the window test checks each upstream reply)


def test_the_proxy_cuts_with_notes_in_place_and_stays_within_the_window(long_conversation, proxy):
    _, engine, transport = proxy
    counters = engine.keeper.counters(LONG_SESSION)
    assert counters.cuts >= 1
    assert counters.notes_calls >= 1
    assert counters.archive_turns >= 1
    # the window holds as the server itself counts: work calls within the budget, and no
    # request (note calls and re-asks included) with its reply larger than the window
    for body, reply in transport.calls_of(SYSTEM):
        usage = reply["usage"]
        assert usage["prompt_tokens"] + usage["completion_tokens"] <= WINDOW
        if not is_note_call(body):
            assert usage["prompt_tokens"] <= WINDOW - RESERVE
            assert usage["completion_tokens"] <= MAX_TOKENS  # the agent's limit reached the server


def test_note_calls_reuse_the_prefix_the_server_already_holds(long_conversation, proxy, counter):
    """Read from the server's usage: a note call repeats the conversation the server has just
    read and adds only the request (or the reply and the re-ask); all that it repeats is served
    from the KV cache. Measured: 59% of a first note call, 87-89% of a re-ask, in this 1K window."""
    _, _, transport = proxy
    calls = transport.calls_of(SYSTEM)
    note_positions = [i for i, (body, _) in enumerate(calls) if is_note_call(body)]
    assert note_positions and note_positions[0] > 0
    for position in note_positions:
        sent = calls[position][0]["messages"]
        shared = shared_prefix(calls[position - 1][0]["messages"], sent)
        assert len(sent) - shared <= 2
        already_read = counter.count_messages(
            [message_from_openai(m, i) for i, m in enumerate(sent[:shared])]
        )
        usage = calls[position][1]["usage"]
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        assert already_read <= cached < usage["prompt_tokens"]


def shared_prefix(first: list[Any], second: list[Any]) -> int:
    """How many leading messages two requests have in common."""
    count = 0
    for a, b in zip(first, second, strict=False):
        if a != b:
            break
        count += 1
    return count


def test_malformed_note_replies_are_counted_by_the_checks_not_crashes(long_conversation, proxy):
    _, engine, transport = proxy
    counters = engine.keeper.counters(LONG_SESSION)
    note_replies = [r for b, r in transport.calls_of(SYSTEM) if is_note_call(b)]
    # every note call the server answered is accounted for: first asks, re-asks and retries
    assert counters.notes_calls == len(note_replies)
    assert counters.notes_calls == (
        counters.note_requests + counters.reasks + counters.thinking_retries
    )
    # whatever the model wrote, only checked lines reached the NOTES: they render and re-read
    notes = engine.keeper.notes("long")
    assert parse_notes(render_notes(notes))[0] == notes


def test_the_keepers_server_count_agrees_with_the_reported_prompt_tokens(
    long_conversation, proxy, counter
):
    """The keeper counts with the server's tokenizer; the template adds its fixed overhead."""
    _, _, transport = proxy
    for body, reply in transport.calls_of(SYSTEM):
        sent = [message_from_openai(m, i) for i, m in enumerate(body["messages"])]
        reported = reply["usage"]["prompt_tokens"]
        counted = counter.count_messages(sent) + CHATML_REPLY_TOKENS
        # exact when measured; a boundary between two texts could merge into one token
        assert abs(counted - reported) <= 2
        # with the tool schemas (which this template does not render) it never counts short
        assert counter.count_messages(sent, body.get("tools", [])) + CHATML_REPLY_TOKENS >= reported


def test_every_upstream_request_is_bounded(long_conversation, proxy):
    _, engine, transport = proxy
    assert transport.exchanges
    for body, _ in transport.exchanges:  # the agent's limit on its calls, the room the window
        limit = body.get("max_tokens") or body.get("max_completion_tokens")  # leaves on notes
        assert limit is not None and limit <= (RESERVE if is_note_call(body) else MAX_TOKENS)
    assert engine.upstream.client.client.timeout.read == TIMEOUT  # the httpx client inside


def test_a_langchain_conversation_through_the_proxy_invoke_and_stream(server, proxy):
    url, _, _ = proxy
    model = ChatOpenAI(
        model=server.model_alias,
        base_url=url,
        api_key="unused",
        timeout=TIMEOUT,
        max_retries=0,
        temperature=0,
        max_tokens=12,
        stream_usage=True,
        default_headers={SESSION_HEADER: "langchain"},
    )
    history: list[BaseMessage] = [HumanMessage("Name a colour.")]
    first = model.invoke(history)
    assert isinstance(first, AIMessage)
    assert 1 <= first.usage_metadata["output_tokens"] <= 12
    history += [first, HumanMessage("Name another one.")]
    streamed = None
    for chunk in model.stream(history):
        streamed = chunk if streamed is None else streamed + chunk
    assert streamed is not None and streamed.usage_metadata is not None
    assert 1 <= streamed.usage_metadata["output_tokens"] <= 12
    assert streamed.usage_metadata["input_tokens"] > first.usage_metadata["input_tokens"]


def test_a_forced_tool_call_round_trip_through_the_proxy(server, proxy):
    url, _, transport = proxy
    client = client_for(url, "tools")
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You answer weather questions."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]
    forced = {"type": "function", "function": {"name": "get_weather"}}
    first = client.chat.completions.create(
        model=server.model_alias,
        messages=messages,
        tools=[WEATHER_TOOL],
        tool_choice=forced,
        max_tokens=40,
        temperature=0,
    )
    calls = first.choices[0].message.tool_calls
    assert [call.function.name for call in calls] == ["get_weather"]
    assert isinstance(json.loads(calls[0].function.arguments), dict)
    assert first.choices[0].finish_reason == "tool_calls"
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [calls[0].model_dump()]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": "Sunny, 21 C."},
    ]
    second = client.chat.completions.create(
        model=server.model_alias, messages=messages, tools=[WEATHER_TOOL], max_tokens=16
    )
    assert second.choices[0].finish_reason in ("stop", "length")
    assert not second.choices[0].message.tool_calls
    # the proxy offered its archive search beside the agent's own tool, and forced the agent's
    sent = transport.calls_of("You answer weather questions.")[0][0]
    assert sent["tools"][0]["function"]["name"] == "get_weather"
    assert sent["tool_choice"] == forced
