"""The proxy speaks the OpenAI protocol on both sides: a reply, its usage and any field it does
not know pass through; a stream is SSE that ends with ``[DONE]`` and carries a usage chunk only
when asked for; the agent's own tool calls go out and their results go back upstream; the model
list is the upstream's. The model's thinking stays out of the history it is sent back (stripped,
the effort forwarded), and an empty reply that thought to its limit is asked again with thinking
off."""

from __future__ import annotations

import json

import pytest

from keeper_middleware.config import KeeperConfig, ThinkingPolicy
from tests.proxy_upstream import (
    AGENT_TOOL,
    SYSTEM,
    chat,
    client_for,
    completion,
    convo,
    make_app,
    proxy_fixture,  # noqa: F401
    sse_payloads,
    text_reply,
    tool_reply,
    upstream_fixture,  # noqa: F401
)

pytestmark = pytest.mark.anyio


# ----------------------------------------------------------------------------- protocol


async def test_non_streaming_reply_usage_and_unknown_fields_pass_through(proxy, upstream):
    upstream.script = [text_reply("Hello there.")]
    body = chat(convo("Hi"), temperature=0.3, top_k=20, custom_field={"a": 1}, tools=[AGENT_TOOL])
    response = await proxy.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    data = response.json()
    assert data["choices"][0]["message"] == {"role": "assistant", "content": "Hello there."}
    assert data["choices"][0]["finish_reason"] == "stop"
    assert data["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    sent = upstream.requests[0]
    assert sent["temperature"] == 0.3 and sent["top_k"] == 20 and sent["custom_field"] == {"a": 1}
    assert sent["model"] == "agent-model" and sent["stream"] is False
    assert sent["messages"] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Hi"},
    ]
    assert sent["tools"][0] == AGENT_TOOL
    assert [t["function"]["name"] for t in sent["tools"]] == ["read_file", "search_archive"]


async def test_streaming_reply_is_sse_with_usage_chunk_and_done(proxy, upstream):
    upstream.script = [text_reply("Streamed answer.")]
    body = chat(convo("Hi"), stream=True, stream_options={"include_usage": True})
    response = await proxy.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_payloads(response.text)
    assert events[-1] == "[DONE]"
    text = "".join(
        e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e["choices"]
    )
    assert text == "Streamed answer."
    usage = [e for e in events[:-1] if not e["choices"]]
    assert len(usage) == 1 and usage[0]["usage"]["prompt_tokens"] == 100
    assert upstream.requests[0]["stream_options"] == {"include_usage": True}


async def test_stream_without_include_usage_has_no_usage_chunk(proxy, upstream):
    response = await proxy.post("/v1/chat/completions", json=chat(convo("Hi"), stream=True))
    events = sse_payloads(response.text)
    assert events[-1] == "[DONE]"
    assert all(e["choices"] for e in events[:-1])


async def test_agent_tool_calls_pass_through_and_results_go_back_upstream(proxy, upstream):
    upstream.script = [
        tool_reply(("call_1", "read_file", {"path": "a.txt"})),
        text_reply("The file says hi."),
    ]
    history = convo("Read a.txt")
    first = (
        await proxy.post("/v1/chat/completions", json=chat(history, tools=[AGENT_TOOL]))
    ).json()
    message = first["choices"][0]["message"]
    assert first["choices"][0]["finish_reason"] == "tool_calls"
    assert message["tool_calls"][0]["function"] == {
        "name": "read_file",
        "arguments": '{"path": "a.txt"}',
    }
    history += [message, {"role": "tool", "tool_call_id": "call_1", "content": "hi"}]
    second = await proxy.post("/v1/chat/completions", json=chat(history, tools=[AGENT_TOOL]))
    assert second.json()["choices"][0]["message"]["content"] == "The file says hi."
    sent = upstream.requests[1]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool"]
    assert sent[2]["tool_calls"][0]["id"] == "call_1"
    assert sent[3] == {"role": "tool", "tool_call_id": "call_1", "content": "hi"}


async def test_models_are_passed_through(proxy):
    response = await proxy.get("/v1/models")
    assert response.json()["data"][0]["id"] == "upstream-model"


# ----------------------------------------------------------------------------- thinking


async def test_reasoning_is_stripped_and_effort_forwarded(upstream, tmp_path):
    upstream.script = [text_reply("<think>long musing</think>Answer.", reasoning_content="why")]
    app = make_app(upstream, tmp_path, reasoning_effort="medium")
    async with client_for(app) as client:
        first = await client.post("/v1/chat/completions", json=chat(convo("Q?")))
        message = first.json()["choices"][0]["message"]
        await client.post(
            "/v1/chat/completions",
            json=chat([*convo("Q?"), message, {"role": "user", "content": "Next"}]),
        )
    assert all(b["reasoning_effort"] == "medium" for b in upstream.requests)
    second = upstream.requests[1]["messages"]
    assert second[2] == {"role": "assistant", "content": "Answer."}
    assert "musing" not in json.dumps(second)
    await app.state.proxy.aclose()


async def test_an_empty_reply_that_thought_to_its_limit_is_asked_again(upstream, tmp_path):
    off = {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}
    config = KeeperConfig(thinking=ThinkingPolicy(off=off))
    app = make_app(upstream, tmp_path, config=config)
    proxy = client_for(app)
    upstream.script = [
        completion({"role": "assistant", "content": ""}, finish="length"),
        text_reply("Short answer."),
    ]
    async with proxy:
        history = convo("Task: answer what is asked.", "ok", "Hard?")
        response = await proxy.post("/v1/chat/completions", json=chat(history))
    assert response.json()["choices"][0]["message"]["content"] == "Short answer."
    assert len(upstream.requests) == 2
    assert "chat_template_kwargs" not in upstream.requests[0]
    assert upstream.requests[1]["chat_template_kwargs"] == {"enable_thinking": False}
    assert (
        app.state.proxy.keeper.counters(
            "default:" + response.headers["x-keeper-session"]
        ).thinking_retries
        == 1
    )
    await app.state.proxy.aclose()
