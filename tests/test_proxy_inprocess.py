"""The keeper proxy in-process: httpx.ASGITransport to the app, the upstream an httpx.MockTransport.

``ScriptedUpstream`` (also used by the socket and fault tests) is an OpenAI-compatible model
server in a few lines: it records every request body, answers note requests with change lines,
and otherwise plays a script of replies (text, tool calls, errors) or a default answer.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from langchain_core.messages import convert_to_messages

from keeper_middleware.config import KeeperConfig, ThinkingPolicy
from keeper_middleware.integrations.proxy import RetryPolicy, create_proxy_app
from keeper_middleware.integrations.proxy.completions import agent_reply
from keeper_middleware.integrations.proxy.history import align, take_in, withdraw
from keeper_middleware.integrations.proxy.openai_format import (
    ChatRequest,
    RequestError,
    digest_of,
    message_from_openai,
    parse_chat_request,
)
from keeper_middleware.integrations.proxy.sessions import SessionRecord
from keeper_middleware.integrations.proxy.tenants import fallback_session
from keeper_middleware.keeper import ModelSetup
from keeper_middleware.messages import keeper_message
from keeper_middleware.notes import Notes, parse_notes, render_notes
from keeper_middleware.tokens import ApproximateTokenCounter

pytestmark = pytest.mark.anyio

SYSTEM = "You are a careful clerk."
AGENT_TOOL = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
}

# ----------------------------------------------------------------------------- the fake upstream


def completion(
    message: dict[str, Any], *, finish: str = "stop", prompt: int = 100, cached: int = 0
) -> dict[str, Any]:
    return {
        "id": "chatcmpl-up",
        "object": "chat.completion",
        "created": 1,
        "model": "upstream-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": 5,
            "total_tokens": prompt + 5,
            "prompt_tokens_details": {"cached_tokens": cached},
        },
    }


def text_reply(text: str, **extra: Any) -> dict[str, Any]:
    return completion({"role": "assistant", "content": text, **extra})


def tool_reply(*calls: tuple[str, str, dict[str, Any]], text: str | None = None) -> dict[str, Any]:
    return completion(
        {
            "role": "assistant",
            "content": text,
            "tool_calls": [
                {
                    "id": cid,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)},
                }
                for cid, name, args in calls
            ],
        },
        finish="tool_calls",
    )


def last_text(body: dict[str, Any]) -> str:
    content = body["messages"][-1].get("content") or ""
    return content if isinstance(content, str) else json.dumps(content)


def is_note_call(body: dict[str, Any]) -> bool:
    return last_text(body).startswith(("[NOTES REQUEST]", "[NOTES CHECK]"))


def as_sse(data: dict[str, Any]) -> bytes:
    """A completion as an OpenAI server would stream it: text in pieces, then tool calls."""
    choice = data["choices"][0]
    message = choice["message"]
    envelope = {k: data[k] for k in ("id", "model", "created") if k in data}

    def event(delta: dict[str, Any], reason: str | None = None) -> str:
        payload = {**envelope, "choices": [{"index": 0, "delta": delta, "finish_reason": reason}]}
        return f"data: {json.dumps(payload)}\n\n"

    out = [event({"role": "assistant", "content": ""})]
    for key in ("reasoning_content", "content"):
        text = message.get(key) or ""
        out += [event({key: text[i : i + 5]}) for i in range(0, len(text), 5)]
    for index, call in enumerate(message.get("tool_calls") or []):
        args = call["function"]["arguments"]
        head = {"index": index, "id": call["id"], "type": "function"}
        out.append(
            event({"tool_calls": [{**head, "function": {"name": call["function"]["name"]}}]})
        )
        out += [
            event({"tool_calls": [{"index": index, "function": {"arguments": args[i : i + 7]}}]})
            for i in range(0, len(args), 7)
        ]
    out.append(event({}, choice.get("finish_reason") or "stop"))
    if "usage" in data:
        out.append(f"data: {json.dumps({**envelope, 'choices': [], 'usage': data['usage']})}\n\n")
    out.append("data: [DONE]\n\n")
    return "".join(out).encode()


@dataclass
class ScriptedUpstream:
    """Script entries: a completion dict, an ``httpx.Response``, an exception to raise, or a
    callable ``(body) -> any of those``. When the script is empty, ``default(body)`` answers."""

    script: list[Any] = field(default_factory=list)
    notes_reply: Callable[[dict[str, Any]], str] = lambda body: "NO CHANGES"
    default: Callable[[dict[str, Any]], Any] = lambda body: text_reply(
        "ok: " + last_text(body)[:40]
    )
    requests: list[dict[str, Any]] = field(default_factory=list)

    @property
    def work_calls(self) -> list[dict[str, Any]]:
        return [b for b in self.requests if not is_note_call(b)]

    @property
    def note_calls(self) -> list[dict[str, Any]]:
        return [b for b in self.requests if is_note_call(b)]

    def answer(self, body: dict[str, Any]) -> httpx.Response:
        self.requests.append(body)
        if is_note_call(body):
            entry: Any = text_reply(self.notes_reply(body))
        else:
            entry = self.script.pop(0) if self.script else self.default
            if callable(entry):
                entry = entry(body)
        if isinstance(entry, BaseException):
            raise entry
        if isinstance(entry, httpx.Response):
            return entry
        if body.get("stream"):
            return httpx.Response(
                200, content=as_sse(entry), headers={"content-type": "text/event-stream"}
            )
        return httpx.Response(200, json=entry)

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"object": "list", "data": [{"id": "upstream-model"}]})
        return self.answer(json.loads(request.content))

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)


FAST_RETRY = RetryPolicy(attempts=3, first_wait=0.0, max_wait=0.0, budget=5.0, timeout=5.0)


def make_app(upstream: ScriptedUpstream, folder: Path, **options: Any) -> Any:
    options.setdefault("window", 32_768)
    options.setdefault("retry", FAST_RETRY)
    return create_proxy_app(
        "http://upstream.test/v1", archive_dir=folder, transport=upstream.transport(), **options
    )


def client_for(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy.test")


def chat(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "agent-model", "messages": messages, **extra}


def convo(*turns: str) -> list[dict[str, Any]]:
    """System, then user/assistant alternating, starting with the user."""
    roles = ("user", "assistant")
    return [{"role": "system", "content": SYSTEM}] + [
        {"role": roles[i % 2], "content": t} for i, t in enumerate(turns)
    ]


def sse_payloads(text: str) -> list[Any]:
    events = [
        line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")
    ]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


@pytest.fixture
def upstream() -> ScriptedUpstream:
    return ScriptedUpstream()


@pytest.fixture
async def proxy(upstream: ScriptedUpstream, tmp_path: Path) -> Any:
    app = make_app(upstream, tmp_path)
    async with client_for(app) as client:
        yield client
    await app.state.proxy.aclose()


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


# ----------------------------------------------------------------------------- sessions


async def test_no_header_falls_back_to_a_hash_of_the_opening(proxy, upstream):
    first = await proxy.post("/v1/chat/completions", json=chat(convo("Task A")))
    reply = first.json()["choices"][0]["message"]
    again = await proxy.post(
        "/v1/chat/completions",
        json=chat([*convo("Task A"), reply, {"role": "user", "content": "More"}]),
    )
    other = await proxy.post("/v1/chat/completions", json=chat(convo("Task B")))
    assert first.headers["x-keeper-session"] == again.headers["x-keeper-session"]
    assert first.headers["x-keeper-session"] != other.headers["x-keeper-session"]
    assert first.headers["x-keeper-session"].startswith("auto-")
    assert [m["content"] for m in upstream.requests[2]["messages"]] == [SYSTEM, "Task B"]


async def test_sessions_named_by_header_are_isolated(proxy, upstream):
    for name in ("alpha", "beta"):
        await proxy.post(
            "/v1/chat/completions",
            json=chat(convo(f"secret of {name}")),
            headers={"X-Keeper-Session": name},
        )
    await proxy.post(
        "/v1/chat/completions",
        json=chat(convo("secret of alpha", "ok: secret of alpha", "and now?")),
        headers={"X-Keeper-Session": "alpha"},
    )
    seen = json.dumps(upstream.requests[2]["messages"])
    assert "secret of alpha" in seen and "beta" not in seen
    info = (await proxy.get("/keeper/sessions/beta")).json()
    assert info["agent_messages"] == 2 and info["window_messages"] == 2


async def test_invalid_session_header_is_a_400(proxy, upstream):
    response = await proxy.post(
        "/v1/chat/completions", json=chat(convo("Hi")), headers={"X-Keeper-Session": "../etc"}
    )
    assert response.status_code == 400
    assert "session" in response.json()["error"]["message"]
    assert upstream.requests == []


async def test_resending_the_same_history_duplicates_nothing(proxy, upstream):
    history = convo("Item 1: alpha", "ok", "Item 2: beta")
    for _ in range(3):
        await proxy.post(
            "/v1/chat/completions", json=chat(history), headers={"X-Keeper-Session": "s"}
        )
    assert [len(b["messages"]) for b in upstream.requests] == [4, 4, 4]
    assert upstream.requests[0]["messages"] == upstream.requests[2]["messages"]


async def test_an_edited_message_replaces_the_old_one_in_view(proxy, upstream):
    headers = {"X-Keeper-Session": "edit"}
    await proxy.post("/v1/chat/completions", json=chat(convo("Item 1: alpha")), headers=headers)
    reply = upstream.default(upstream.requests[0])["choices"][0]["message"]
    history = [*convo("Item 1: alpha"), reply, {"role": "user", "content": "Item 2: beta"}]
    await proxy.post("/v1/chat/completions", json=chat(history), headers=headers)
    history[-1] = {"role": "user", "content": "Item 2: gamma"}
    await proxy.post("/v1/chat/completions", json=chat(history), headers=headers)
    texts = [m["content"] for m in upstream.requests[-1]["messages"]]
    assert texts[-1] == "Item 2: gamma" and "Item 2: beta" not in texts
    assert len(texts) == 4


async def test_regenerate_withdraws_the_previous_reply(proxy, upstream):
    upstream.script = [text_reply("first try"), text_reply("second try")]
    headers = {"X-Keeper-Session": "regen"}
    await proxy.post("/v1/chat/completions", json=chat(convo("Question?")), headers=headers)
    again = await proxy.post("/v1/chat/completions", json=chat(convo("Question?")), headers=headers)
    assert again.json()["choices"][0]["message"]["content"] == "second try"
    assert "first try" not in json.dumps(upstream.requests[1]["messages"])


async def test_an_edit_of_an_archived_message_is_taken_as_new_input_alone(upstream, tmp_path):
    app = make_app(upstream, tmp_path, window=2048)
    async with client_for(app) as client:
        history = await run_items(client, 12, "past")
        keeper = app.state.proxy.keeper
        assert any(t.content.startswith("Item 2:") for t in keeper.archive.turns("default:past"))
        history[4] = {"role": "user", "content": "Item 2: correction, domo2 was 15."}
        history.append({"role": "user", "content": "Item 13: domo13 is 1."})
        response = await client.post(
            "/v1/chat/completions", json=chat(history), headers={"X-Keeper-Session": "past"}
        )
    assert response.status_code == 200
    sent = [m.get("content") or "" for m in upstream.work_calls[-1]["messages"]]
    assert sent[-2:] == ["Item 2: correction, domo2 was 15.", "Item 13: domo13 is 1."]
    for i in range(3, 13):  # the unchanged messages after the edit are not taken in again
        in_view = sum(text.startswith(f"Item {i}:") for text in sent)
        archived = sum(
            t.content.startswith(f"Item {i}:") for t in keeper.archive.turns("default:past")
        )
        assert in_view + archived == 1, i
    assert app.state.proxy.stats("default:past").withdrawn_messages == 1
    await app.state.proxy.aclose()


async def test_overlapping_requests_of_one_session_run_one_at_a_time(tmp_path):
    in_flight, peak = 0, 0

    async def slow(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.05)
        in_flight -= 1
        return httpx.Response(200, json=text_reply("done"))

    app = create_proxy_app(
        "http://upstream.test/v1",
        window=32_768,
        archive_dir=tmp_path,
        transport=httpx.MockTransport(slow),
    )
    async with client_for(app) as client:
        results = await asyncio.gather(
            *[
                client.post(
                    "/v1/chat/completions",
                    json=chat(convo("Same task")),
                    headers={"X-Keeper-Session": "one"},
                )
                for _ in range(4)
            ]
        )
    await app.state.proxy.aclose()
    assert [r.status_code for r in results] == [200] * 4
    assert peak == 1


# ----------------------------------------------------------------------------- the window


def story(i: int) -> str:
    return (
        f"Item {i}: The clerk recorded domo{i} at {i * 7}. " + "The rain kept on. " * 40
    ).strip()


async def run_items(
    client: httpx.AsyncClient, count: int, session: str, start: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    history = start or [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Task: keep the ledger."},
    ]
    for i in range(1, count + 1):
        history.append({"role": "user", "content": story(i)})
        response = await client.post(
            "/v1/chat/completions", json=chat(history), headers={"X-Keeper-Session": session}
        )
        assert response.status_code == 200, response.text
        history.append(response.json()["choices"][0]["message"])
    return history


def request_tokens(body: dict[str, Any]) -> int:
    messages = convert_to_messages(
        [{**m, "content": m.get("content") or ""} for m in body["messages"]]
    )
    return ApproximateTokenCounter().count_messages(messages, body.get("tools") or [])


async def test_the_upstream_never_gets_more_than_the_window(upstream, tmp_path):
    upstream.notes_reply = lambda body: "NO CHANGES"
    app = make_app(upstream, tmp_path, window=2048)
    async with client_for(app) as client:
        await run_items(client, 30, "small")
    keeper = app.state.proxy.keeper
    budget = keeper.config.budget
    assert keeper.counters("default:small").cuts >= 3
    assert max(request_tokens(b) for b in upstream.requests) <= budget
    assert keeper.archive.turn_count("default:small") > 30
    await app.state.proxy.aclose()


async def test_note_calls_render_like_main_calls_and_extend_what_the_server_read(
    upstream, tmp_path
):
    app = make_app(upstream, tmp_path, window=3072)
    async with client_for(app) as client:
        await run_items(
            client,
            12,
            "cache",
        )
    notes = [i for i, b in enumerate(upstream.requests) if is_note_call(b)]
    assert notes
    for index in notes:
        note_call, before = upstream.requests[index], upstream.requests[index - 1]
        assert note_call["messages"][0] == {"role": "system", "content": SYSTEM}
        assert note_call["tools"] == before["tools"]
        assert note_call["model"] == before["model"]
        # the previous call's messages are a prefix of the note call: the server has read them
        assert note_call["messages"][: len(before["messages"])] == before["messages"]
    await app.state.proxy.aclose()


async def test_rules_from_the_notes_are_repeated_next_to_a_new_question(upstream, tmp_path):
    rule = "Any figure below zero is reported as the word overdrawn."
    upstream.notes_reply = lambda body: f"RULE: {rule}"
    app = make_app(upstream, tmp_path, window=2048)
    async with client_for(app) as client:
        start = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Task: keep the ledger. {rule}"},
        ]
        history = await run_items(client, 12, "rules", start)
        history.append({"role": "user", "content": "What is domo12 now?"})
        await client.post(
            "/v1/chat/completions", json=chat(history), headers={"X-Keeper-Session": "rules"}
        )
    assert rule in app.state.proxy.keeper.notes("default:rules").rules
    sent = upstream.work_calls[-1]["messages"]
    assert sent[-2]["content"] == "What is domo12 now?"
    assert sent[-1]["content"].startswith("[RULES]") and rule in sent[-1]["content"]
    await app.state.proxy.aclose()


# ----------------------------------------------------------------------------- searches


def search_call(cid: str, query: str) -> dict[str, Any]:
    return tool_reply((cid, "search_archive", {"query": query}))


async def test_searches_are_answered_inside_the_proxy(upstream, tmp_path):
    app = make_app(upstream, tmp_path, window=2048)
    async with client_for(app) as client:
        history = await run_items(client, 12, "search")
        upstream.script = [search_call("s1", "domo2"), text_reply("domo2 was 14.")]
        history.append({"role": "user", "content": "What was domo2?"})
        response = await client.post(
            "/v1/chat/completions", json=chat(history), headers={"X-Keeper-Session": "search"}
        )
    message = response.json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "domo2 was 14."}
    after = upstream.work_calls[-1]["messages"]
    assert after[-2]["tool_calls"][0]["function"]["name"] == "search_archive"
    assert after[-1]["role"] == "tool"
    assert "item 2: Item 2: The clerk recorded domo2 at 14." in after[-1]["content"]
    assert app.state.proxy.keeper.counters("default:search").searches == 1
    await app.state.proxy.aclose()


async def test_a_reply_mixing_agent_tools_and_searches_answers_both(proxy, upstream):
    upstream.script = [
        tool_reply(("s1", "search_archive", {"query": "x"}), ("c1", "read_file", {"path": "a"})),
        text_reply("done"),
    ]
    history = convo("Go")
    response = await proxy.post("/v1/chat/completions", json=chat(history, tools=[AGENT_TOOL]))
    message = response.json()["choices"][0]["message"]
    assert [c["id"] for c in message["tool_calls"]] == ["c1"]  # the agent's own call comes back
    assert response.json()["choices"][0]["finish_reason"] == "tool_calls"
    history += [message, {"role": "tool", "tool_call_id": "c1", "content": "file a"}]
    await proxy.post("/v1/chat/completions", json=chat(history, tools=[AGENT_TOOL]))
    second = upstream.work_calls[1]["messages"]
    assert [c["id"] for c in second[-3]["tool_calls"]] == ["s1", "c1"]  # the whole reply, once
    answered = [m["tool_call_id"] for m in second if m["role"] == "tool"]
    assert answered == ["s1", "c1"]  # the search answered by the proxy, the file by the agent


async def test_results_of_a_turn_that_ended_empty_are_shown_again(proxy, upstream):
    # an empty reply is asked again once; the second empty one ends the turn empty
    upstream.script = [
        search_call("s1", "domo"),
        text_reply(""),
        text_reply(""),
        text_reply("Now I answer."),
    ]
    headers = {"X-Keeper-Session": "empty"}
    first = await proxy.post(
        "/v1/chat/completions", json=chat(convo("Questions?")), headers=headers
    )
    assert first.json()["choices"][0]["message"]["content"] == ""
    # the agent drops the empty reply and asks again
    await proxy.post(
        "/v1/chat/completions",
        json=chat([*convo("Questions?"), {"role": "user", "content": "Answer please?"}]),
        headers=headers,
    )
    sent = upstream.requests[-1]["messages"]
    assert any(m["role"] == "tool" and m["tool_call_id"] == "s1" for m in sent)
    assert sent[-1]["content"] == "Answer please?"


async def test_an_agent_tool_named_like_the_search_tool_passes_through(proxy, upstream):
    own = {"type": "function", "function": {"name": "search_archive", "parameters": {}}}
    upstream.script = [search_call("s1", "mine")]
    response = await proxy.post("/v1/chat/completions", json=chat(convo("Go"), tools=[own]))
    assert response.json()["choices"][0]["message"]["tool_calls"][0]["id"] == "s1"
    assert upstream.requests[0]["tools"] == [own]


async def test_the_search_loop_is_bounded(upstream, tmp_path):
    upstream.default = lambda body: search_call(f"s{len(body['messages'])}", "again")
    app = make_app(upstream, tmp_path, max_upstream_calls=4)
    async with client_for(app) as client:
        response = await client.post("/v1/chat/completions", json=chat(convo("Loop?")))
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"] == {"role": "assistant", "content": ""}
    assert len(upstream.work_calls) == 4
    await app.state.proxy.aclose()


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


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("content", "status", "words"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (b'{"model": "m"}', 400, "messages"),
        (b'{"messages": [{"role": "wizard", "content": "x"}]}', 400, "role"),
        (b'{"messages": [{"role": "tool", "content": "x"}]}', 400, "tool_call_id"),
        (b'{"messages": [{"role": "system", "content": "x"}]}', 400, "only system"),
        (b'{"messages": [{"role": "user", "content": 5}]}', 400, "content"),
        (b'{"messages": [{"role": "user", "content": "x"}], "n": 2}', 400, "n=1"),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "web"}]}',
            400,
            "tools[0]",
        ),
        (b'{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}', 400, "stream"),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"function": {"name": "f"}}]}',
            400,
            "tools[0]",
        ),
    ],
)
async def test_malformed_requests_get_a_clear_4xx(proxy, upstream, content, status, words):
    response = await proxy.post(
        "/v1/chat/completions", content=content, headers={"content-type": "application/json"}
    )
    assert response.status_code == status
    assert words in response.json()["error"]["message"]
    assert upstream.requests == []


async def test_oversized_request_is_a_413(upstream, tmp_path):
    app = make_app(upstream, tmp_path, max_body_bytes=1000)
    async with client_for(app) as client:
        response = await client.post("/v1/chat/completions", json=chat(convo("x" * 2000)))
    assert response.status_code == 413
    assert "larger than 1000 bytes" in response.json()["error"]["message"]
    await app.state.proxy.aclose()


async def test_api_key_is_required_everywhere_when_set(upstream, tmp_path):
    app = make_app(upstream, tmp_path, api_key="sekrit")
    async with client_for(app) as client:
        for method, path in (
            ("POST", "/v1/chat/completions"),
            ("GET", "/v1/models"),
            ("GET", "/metrics"),
        ):
            response = await client.request(method, path, json=chat(convo("x")))
            assert response.status_code == 401
            assert response.json()["error"]["code"] == "invalid_api_key"
        ok = await client.post(
            "/v1/chat/completions",
            json=chat(convo("x")),
            headers={"Authorization": "Bearer sekrit"},
        )
        assert ok.status_code == 200
    assert "authorization" not in {k.lower() for k in upstream.requests[0]}
    await app.state.proxy.aclose()


async def test_unknown_routes_get_json_errors(proxy):
    response = await proxy.get("/v1/nothing")
    assert response.status_code == 404
    assert "error" in response.json()
    missing = await proxy.get("/keeper/sessions/never-seen")
    assert missing.status_code == 404


# ----------------------------------------------------------------------------- counters


async def test_metrics_and_session_report(upstream, tmp_path):
    upstream.default = lambda body: completion(
        {"role": "assistant", "content": "ok"}, prompt=200, cached=150
    )
    app = make_app(upstream, tmp_path, window=2048)
    async with client_for(app) as client:
        await run_items(client, 12, "counted")
        metrics = (await client.get("/metrics")).text
        info = (await client.get("/keeper/sessions/counted")).json()
    assert 'keeper_proxy_requests_total{tenant="default"} 12.0' in metrics
    assert "counted" not in metrics  # no session ids unless asked for
    assert "# TYPE keeper_proxy_cuts_total counter" in metrics
    counters = info["counters"]
    work, notes = len(upstream.work_calls), len(upstream.note_calls)
    assert counters["prompt_tokens"] == 200 * work + 100 * notes  # notes replies: 100, none cached
    assert counters["cached_tokens"] == 150 * work
    ratio = counters["cached_tokens"] / counters["prompt_tokens"]
    shown = next(
        line for line in metrics.splitlines() if line.startswith("keeper_proxy_cached_ratio{")
    )
    assert abs(float(shown.split()[-1]) - ratio) < 1e-9
    assert info["counters"]["cuts"] >= 1 and info["archive_turns"] > 0
    assert info["notes"].startswith("[NOTES]")
    assert info["proxy"]["upstream_calls"] == len(upstream.requests)
    assert info["proxy"]["added_seconds"] >= 0
    await app.state.proxy.aclose()


# ----------------------------------------------------------------------------- pure parts


def NOTHING_ARCHIVED(ids: set[str]) -> set[str]:  # noqa: N802
    return set()


def test_alignment_is_by_content_not_position():
    assert align(["a", "b"], ["a", "b", "c"]) == [(0, 0), (1, 1)]  # continuing
    assert align(["a", "b", "c"], ["b", "c", "d"]) == [(1, 0), (2, 1)]  # front trimmed
    assert align(["a", "b", "c"], ["a", "x", "c"]) == [(0, 0), (2, 2)]  # edited in place
    assert align(["a", "b"], ["a"]) == [(0, 0)]  # regenerated
    assert align([], ["a"]) == [] and align(["a"], ["z"]) == []  # new, or foreign


def test_digest_ignores_how_clients_reserialise_a_reply():
    ours = message_from_openai(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"b": 1, "a": 2}'},
                }
            ],
        }
    )
    theirs = message_from_openai(
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "hm",
            "tool_calls": [
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"a":2,"b":1}'},
                }
            ],
        }
    )
    assert digest_of(ours) == digest_of(theirs)
    other = message_from_openai({"role": "user", "content": ""})
    assert digest_of(ours) != digest_of(other)


def test_a_reply_sent_back_by_chat_openai_is_recognised():
    from langchain_openai.chat_models.base import _convert_dict_to_message, _convert_message_to_dict

    data = tool_reply(("call_9", "read_file", {"path": "a.txt", "n": 2}), text=None)
    ours, _ = agent_reply(data, "search_archive")
    resent = _convert_message_to_dict(_convert_dict_to_message(ours))
    assert digest_of(message_from_openai(resent)) == digest_of(message_from_openai(ours))


def test_withdrawing_inside_the_kept_messages_lowers_the_notes_count():
    counter = iter(range(100))

    def new_id() -> str:
        return f"m{next(counter)}"

    notes = keeper_message(render_notes(Notes(), kept=2), "notes", msg_id="notes-1")
    task = message_from_openai({"role": "user", "content": "Task"}).model_copy(update={"id": "t"})
    kept = [
        message_from_openai({"role": "user", "content": f"k{i}"}).model_copy(update={"id": f"k{i}"})
        for i in range(2)
    ]
    window = (task, notes, *kept)
    trimmed = withdraw(window, {"k1"})
    assert [m.id for m in trimmed] == ["t", "notes-1", "k0"]
    assert parse_notes(trimmed[1].content)[1] == 1
    assert withdraw(window, {"t"}) == window  # the pinned head stays once NOTES exist
    record = SessionRecord(window=window, taken=(("d-task", "t"), ("d-k0", "k0"), ("d-k1", "k1")))
    fresh = message_from_openai({"role": "user", "content": "k1 edited"})
    intake = take_in(
        record,
        [task, kept[0], fresh],
        ["d-task", "d-k0", digest_of(fresh)],
        new_id,
        NOTHING_ARCHIVED,
    )
    assert intake.withdrawn == 1 and intake.new == 1
    assert [m.content for m in intake.record.window][-2:] == ["k0", "k1 edited"]


def test_withdrawing_a_message_that_precedes_a_late_edit_keeps_the_edit_once():
    ids = iter(f"n{i}" for i in range(100))
    msgs = [
        message_from_openai({"role": "user", "content": f"m{i}"}).model_copy(update={"id": f"m{i}"})
        for i in range(4)
    ]
    notes = keeper_message(render_notes(Notes()), "notes", msg_id="notes-1")
    # m0 archived (its edit e0 sits at the end of the window); m1..m3 in view
    edit = msgs[0].model_copy(update={"id": "e0", "content": "m0 edited"})
    window = (notes, msgs[1], msgs[2], msgs[3], edit)
    record = SessionRecord(
        window=window, taken=(("d-e0", "e0"), ("d1", "m1"), ("d2", "m2"), ("d3", "m3"))
    )
    again = [edit, msgs[1]]  # the agent drops m2 and m3
    intake = take_in(record, again, ["d-e0", "d1"], lambda: next(ids), NOTHING_ARCHIVED)
    contents = [m.content for m in intake.record.window]
    assert contents.count("m0 edited") == 1 and "m2" not in contents
    assert [d for d, _ in intake.record.taken] == ["d-e0", "d1"]


def test_session_record_survives_json():
    request: ChatRequest = parse_chat_request(chat(convo("Hi", "Hello", "More?")))
    record = take_in(
        SessionRecord(), request.messages, request.digests, lambda: "x", NOTHING_ARCHIVED
    ).record
    record = SessionRecord(
        window=record.window,
        keeper_state={"seen": []},
        taken=tuple((d, f"id{i}") for i, (d, _) in enumerate(record.taken)),
    )
    again = SessionRecord.from_json(json.loads(json.dumps(record.to_json())))
    assert again == record


def test_fallback_session_depends_on_system_and_first_user_message():
    a = parse_chat_request(chat(convo("Task", "ok", "more")))
    b = parse_chat_request(chat(convo("Task")))
    c = parse_chat_request(
        chat([{"role": "system", "content": "other"}, {"role": "user", "content": "Task"}])
    )
    assert fallback_session(a.system_prompt, a.messages) == fallback_session(
        b.system_prompt, b.messages
    )
    assert fallback_session(a.system_prompt, a.messages) != fallback_session(
        c.system_prompt, c.messages
    )


def test_parse_rejects_a_tool_call_without_a_name():
    with pytest.raises(RequestError, match=r"function\.name"):
        parse_chat_request(
            chat(
                [
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "tool_calls": [{"id": "c"}]},
                ]
            )
        )


def test_model_setup_renders_the_agent_system_prompt():
    request = parse_chat_request(chat(convo("Hi")))
    setup = ModelSetup(system_prompt=request.system_prompt)
    assert setup.render(list(request.messages))[0].content == SYSTEM
