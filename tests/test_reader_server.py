"""Over HTTP the simulated reader gives the same replies as in-process, to real OpenAI clients."""

from __future__ import annotations

import json

import httpx
import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.messages.utils import convert_to_openai_messages
from langchain_openai import ChatOpenAI
from openai import OpenAI

from keeper_bench.reader import SimulatedReader
from keeper_bench.reader.server import create_reader_app, main, serve_reader
from tests.reader_stories import ITEM_2, SEARCH_TOOL, TALLY, item_1, questions, search_result, story

ANSWERING = [
    *story(item_1(TALLY), ITEM_2),
    questions("What value does domo86 hold now?", "What is the tally of domo86 now?"),
]
SEARCHING = [*story(ITEM_2), questions("What value did domo86 hold at the end of item 1?")]


@pytest.fixture(scope="module")
def base_url():
    with serve_reader() as url:
        yield url


def chat(base_url: str, **kwargs) -> ChatOpenAI:
    return ChatOpenAI(
        model="simulated-reader",
        base_url=base_url,
        api_key="x",
        max_retries=0,
        timeout=30,
        **kwargs,
    )


@pytest.mark.parametrize("streaming", [False, True])
def test_chat_openai_gets_the_in_process_answers(base_url, streaming):
    expected = SimulatedReader().invoke(ANSWERING)
    remote = chat(base_url, streaming=streaming, stream_usage=True)
    reply = remote.invoke(ANSWERING)
    assert reply.content == expected.content
    assert reply.usage_metadata["input_tokens"] == expected.usage_metadata["input_tokens"]
    assert reply.usage_metadata["output_tokens"] == expected.usage_metadata["output_tokens"]
    assert reply.response_metadata["model_name"] == "simulated-reader"


@pytest.mark.parametrize("streaming", [False, True])
def test_tool_calls_come_back_parsed_and_the_conversation_continues(base_url, streaming):
    remote = chat(base_url, streaming=streaming, stream_usage=True).bind_tools([SEARCH_TOOL])
    local = SimulatedReader().bind_tools([SEARCH_TOOL])
    first = remote.invoke(SEARCHING)
    assert first.tool_calls == local.invoke(SEARCHING).tool_calls
    assert first.response_metadata["finish_reason"] == "tool_calls"
    history = [
        *SEARCHING,
        first,
        search_result(
            first.tool_calls[0],
            'Found 1 match for "domo86".\nitem 1: The clerk recorded domo86 at 7. → next: The rain fell.',
        ),
    ]
    assert remote.invoke(history).content == local.invoke(history).content == "1. 7"


def test_the_openai_client_streams_and_ends_with_usage(base_url):
    client = OpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=30)
    body = convert_to_openai_messages(ANSWERING)
    plain = client.chat.completions.create(model="simulated-reader", messages=body)
    stream = client.chat.completions.create(
        model="simulated-reader", messages=body, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert (
        streamed == plain.choices[0].message.content == SimulatedReader().invoke(ANSWERING).content
    )
    assert chunks[-1].usage.prompt_tokens == plain.usage.prompt_tokens
    assert plain.model == "simulated-reader"


def test_cached_tokens_grow_for_a_request_that_extends_the_previous_one():
    with serve_reader() as url:
        client = OpenAI(base_url=url, api_key="x", max_retries=0, timeout=30)
        short = convert_to_openai_messages(story(item_1(TALLY)))
        longer = convert_to_openai_messages(
            [*story(item_1(TALLY), ITEM_2), questions("What value does domo86 hold now?")]
        )
        first = client.chat.completions.create(model="m", messages=short)
        second = client.chat.completions.create(model="m", messages=longer)
        third = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Something else."}]
        )
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert 0 < second.usage.prompt_tokens_details.cached_tokens < second.usage.prompt_tokens
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 10
    assert third.usage.prompt_tokens_details.cached_tokens == 0


@pytest.fixture
def asgi_client():
    transport = httpx.ASGITransport(app=create_reader_app())
    return httpx.AsyncClient(transport=transport, base_url="http://reader")


@pytest.mark.anyio
async def test_null_content_unknown_fields_and_token_limits_are_accepted(asgi_client):
    body = {
        "model": "anything",
        "messages": [
            *convert_to_openai_messages(SEARCHING),
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {
                            "name": "search_archive",
                            "arguments": json.dumps({"query": "domo86", "to_item": 1}),
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": 'No matches for "domo86".'},
        ],
        "tools": [SEARCH_TOOL],
        "max_tokens": 64,
        "max_completion_tokens": 64,
        "reasoning_effort": "low",
        "top_k": 20,
    }
    async with asgi_client as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "1. unknown"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("payload", "complaint"),
    [
        ("not json", "not JSON"),
        ({"messages": []}, "non-empty list"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "role"),
        ({"messages": [{"role": "user", "content": 5}]}, "content"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "tool_call_id"),
        (
            {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]},
            "function.name",
        ),
    ],
)
async def test_malformed_requests_get_an_openai_style_400(asgi_client, payload, complaint):
    async with asgi_client as client:
        if isinstance(payload, str):
            response = await client.post("/v1/chat/completions", content=payload)
        else:
            response = await client.post("/v1/chat/completions", json=payload)
    assert response.status_code == 400
    error = response.json()["error"]
    assert complaint in error["message"] and error["type"] == "invalid_request_error"


@pytest.mark.anyio
async def test_models_and_tokenize(asgi_client):
    async with asgi_client as client:
        models = (await client.get("/v1/models")).json()
        tokens = (await client.post("/tokenize", json={"content": "Item 1. The clerk."})).json()
        bad = await client.post("/tokenize", json={"text": "wrong field"})
    assert [m["id"] for m in models["data"]] == ["simulated-reader"]
    assert len(tokens["tokens"]) == 5
    assert bad.status_code == 400


def test_faults_are_served_too():
    from keeper_bench.reader.faults import ReaderFaults

    with serve_reader(SimulatedReader(faults=ReaderFaults(think_to_limit=1))) as url:
        reply = chat(url).invoke(ANSWERING)
        thinking_off = chat(url).invoke(
            ANSWERING, extra_body={"chat_template_kwargs": {"enable_thinking": False}}
        )
    assert reply.content == "" and reply.response_metadata["finish_reason"] == "length"
    assert thinking_off.content == SimulatedReader().invoke(ANSWERING).content


def test_the_command_line_refuses_an_unknown_fault():
    with pytest.raises(SystemExit):
        main(["--fault", "teleport=0.5"])


def test_in_process_and_served_replies_for_an_assistant_turn_with_text_and_no_tools(base_url):
    history = [*story(item_1(TALLY)), AIMessage("Noted."), HumanMessage(ITEM_2)]
    assert (
        chat(base_url).invoke(history).content
        == SimulatedReader().invoke(history).content
        == "Read item 2."
    )
