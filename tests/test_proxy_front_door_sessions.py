"""Sessions at the Responses and Messages front doors: named by the client's own conversation
and isolated per tenant; a client's own compaction loses nothing; text a stream passed on before
an archive search is part of the reply the client sends back (so it is not taken for a new
message); the usage a client sees is the window actually sent."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from keeper_middleware.integrations.proxy import Tenants
from keeper_middleware.messages.facts import text_of
from tests.client_requests import CLAUDE_SESSION, claude_body, codex_body, codex_step, user_item
from tests.proxy_upstream import (
    ScriptedUpstream,
    client_for,
    completion,
    make_app,
    text_reply,
    tool_reply,
)

pytestmark = pytest.mark.anyio
CLAUDE = {"x-claude-code-session-id": CLAUDE_SESSION}


async def test_one_client_session_header_under_two_tenants_is_two_sessions(tmp_path):
    upstream = ScriptedUpstream(default=lambda body: text_reply("noted"))
    app = make_app(upstream, tmp_path, tenants=Tenants({"key-a": "acme", "key-b": "beta"}))
    async with client_for(app) as client:
        for key in ("key-a", "key-b"):
            headers = {"x-api-key": key, **CLAUDE}
            got = await client.post("/v1/messages", json=claude_body(stream=False), headers=headers)
            assert got.headers["x-keeper-session"] == f"claude-{CLAUDE_SESSION}"
        proxy = app.state.proxy
        assert sorted(proxy.sessions()) == [
            f"acme:claude-{CLAUDE_SESSION}",
            f"beta:claude-{CLAUDE_SESSION}",
        ]
        mine = await client.get("/keeper/sessions", headers={"authorization": "Bearer key-b"})
        assert mine.json() == {"sessions": [f"claude-{CLAUDE_SESSION}"]}
        metrics = (await client.get("/metrics", headers={"authorization": "Bearer key-a"})).text
        assert 'keeper_proxy_requests_total{tenant="acme"} 1.0' in metrics
        assert 'keeper_proxy_requests_total{tenant="beta"} 1.0' in metrics
    await app.state.proxy.aclose()


async def codex_turns(client: httpx.AsyncClient, steps: int) -> list[dict[str, Any]]:
    """A Codex conversation of ``steps`` tool steps, sent request by request."""
    history: list[dict[str, Any]] = [user_item("TASK-1: list everything.")]
    headers = {"session-id": "thread-1", "x-codex-window-id": "thread-1:0"}
    for step in range(1, steps + 1):
        body = codex_body(*history, stream=False)
        assert (await client.post("/v1/responses", json=body, headers=headers)).status_code == 200
        history += codex_step(step, f"cat f{step}", f"file {step} says {step * 11}")
    return history


async def test_after_codex_compacts_its_history_the_keeper_still_holds_what_it_dropped(tmp_path):
    """Codex's next window keeps the prompts and a summary; the turns it dropped stay in the
    keeper's view (they are archived at the next cut), where an edit would withdraw them."""
    for window, kept in (("thread-1:1", True), ("thread-1:0", False)):
        upstream = ScriptedUpstream(default=lambda body: text_reply("ok"))
        app = make_app(upstream, tmp_path / window.replace(":", "-"))
        proxy = app.state.proxy
        async with client_for(app) as client:
            await codex_turns(client, 3)
            (name,) = proxy.sessions()
            before = proxy.stats(name).withdrawn_messages
            summary = user_item("Another language model started to solve this problem and "
                                "produced a summary: files 1 to 3 read.", "msg_sum")  # fmt: skip
            compacted = codex_body(user_item("TASK-1: list everything."), summary, stream=False)
            headers = {"session-id": "thread-1", "x-codex-window-id": window}
            assert (
                await client.post("/v1/responses", json=compacted, headers=headers)
            ).status_code == 200
        view = " ".join(text_of(m) for m in proxy.record(name).window)
        assert ("file 2 says 22" in view) is kept
        assert (proxy.stats(name).withdrawn_messages == before) is kept
        assert "produced a summary" in view
        await proxy.aclose()


def search_then(text: str, final: str) -> list[Any]:
    """An upstream that writes some text with an archive search, then its answer."""
    return [
        tool_reply(("s1", "search_archive", {"query": "file 2"}), text=text),
        text_reply(final),
    ]


async def test_text_streamed_before_a_search_belongs_to_the_reply_the_client_sends_back(tmp_path):
    upstream = ScriptedUpstream(script=search_then("Let me look. ", "File 2 says 22."))
    app = make_app(upstream, tmp_path)
    headers = {"session-id": "thread-2"}
    async with client_for(app) as client:
        body = codex_body(user_item("What does file 2 say?"))
        got = await client.post("/v1/responses", json=body, headers=headers)
        completed = [json.loads(line.removeprefix("data: ")) for line in got.text.splitlines()
                     if line.startswith("data: ")][-1]  # fmt: skip
        assert completed["type"] == "response.completed"
        output = completed["response"]["output"]
        texts = [c["text"] for item in output if item["type"] == "message" for c in item["content"]]
        assert "".join(texts) == "Let me look. File 2 says 22."
        assert "search_archive" not in got.text
        again = codex_body(user_item("What does file 2 say?"), *output, user_item("Thanks."))
        upstream.script = [text_reply("You are welcome.")]
        assert (await client.post("/v1/responses", json=again, headers=headers)).status_code == 200
    proxy = app.state.proxy
    (name,) = proxy.sessions()
    assert proxy.stats(name).withdrawn_messages == 0  # its own reply, recognised
    replies = [m for m in proxy.record(name).window if m.type == "ai"]
    assert [text_of(m) for m in replies] == ["Let me look. ", "File 2 says 22.", "You are welcome."]
    await proxy.aclose()


async def test_the_usage_a_client_sees_is_the_window_sent_not_the_turns_sum(tmp_path):
    """Codex and Claude Code compact their own history when the usage they are told nears
    their limit: they are told the size of the window the keeper sent."""
    first = tool_reply(("s1", "search_archive", {"query": "x"}))
    first["usage"] = {"prompt_tokens": 9000, "completion_tokens": 5, "total_tokens": 9005}
    last = completion({"role": "assistant", "content": "done"}, prompt=1200)
    upstream = ScriptedUpstream(script=[first, last, first, last])
    app = make_app(upstream, tmp_path)
    async with client_for(app) as client:
        responses = await client.post(
            "/v1/responses", json=codex_body(user_item("x"), stream=False)
        )
        messages = await client.post("/v1/messages", json=claude_body(stream=False))
    assert responses.json()["usage"]["input_tokens"] == 1200
    usage = messages.json()["usage"]
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == 1200
    await app.state.proxy.aclose()


async def test_a_messages_upstream_gets_the_clients_anthropic_headers_and_the_proxys_key(tmp_path):
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        reply = {"id": "msg_up", "type": "message", "role": "assistant", "model": "m",
                 "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
                 "usage": {"input_tokens": 3, "output_tokens": 1}}  # fmt: skip
        return httpx.Response(200, json=reply)

    from keeper_middleware.integrations.proxy import create_proxy_app
    from tests.proxy_upstream import FAST_RETRY

    app = create_proxy_app(
        "http://upstream.test/v1", window=32_768, archive_dir=tmp_path, retry=FAST_RETRY,
        transport=httpx.MockTransport(answer), upstream_api="messages", upstream_api_key="sk-up",
    )  # fmt: skip
    beta = "claude-code-20250219,interleaved-thinking-2025-05-14"
    async with client_for(app) as client:
        got = await client.post(
            "/v1/messages?beta=true", json=claude_body(stream=False),
            headers={"anthropic-beta": beta, "anthropic-version": "2023-06-01", "x-api-key": "k"},
        )  # fmt: skip
    assert got.status_code == 200 and got.json()["id"] == "msg_up"
    (request,) = seen
    assert request.url.path == "/v1/messages"
    assert request.headers["x-api-key"] == "sk-up" and "authorization" not in request.headers
    assert request.headers["anthropic-beta"] == beta
    body = json.loads(request.content)
    assert body["thinking"] == {"type": "adaptive", "display": "omitted"}
    assert body["context_management"]["edits"][0]["type"] == "clear_thinking_20251015"
    await app.state.proxy.aclose()


async def test_a_messages_stream_keeps_text_before_a_search_in_a_block_of_its_own(tmp_path):
    upstream = ScriptedUpstream(script=search_then("Let me look. ", "File 2 says 22."))
    app = make_app(upstream, tmp_path)
    async with client_for(app) as client:
        body = claude_body(stream=True)
        got = await client.post("/v1/messages", json=body, headers=CLAUDE)
        events = [json.loads(line.removeprefix("data: ")) for line in got.text.splitlines()
                  if line.startswith("data: ")]  # fmt: skip
        texts = [e["delta"]["text"] for e in events if e["type"] == "content_block_delta"]
        starts = [e["index"] for e in events if e["type"] == "content_block_start"]
        assert "".join(texts) == "Let me look. File 2 says 22." and starts == [0, 1]
        assert "search_archive" not in got.text
        blocks = [
            {"type": "text", "text": "Let me look. "},
            {"type": "text", "text": "File 2 says 22."},
        ]
        body = claude_body({"role": "assistant", "content": blocks},
                           {"role": "user", "content": "Thanks."}, stream=False)  # fmt: skip
        upstream.script = [text_reply("You are welcome.")]
        assert (await client.post("/v1/messages", json=body, headers=CLAUDE)).status_code == 200
    proxy = app.state.proxy
    (name,) = proxy.sessions()
    assert proxy.stats(name).withdrawn_messages == 0
    await proxy.aclose()


@pytest.mark.parametrize("door", ["responses", "messages"])
async def test_a_model_that_never_stops_searching_ends_with_an_answer_at_either_door(
    tmp_path, door
):
    """Past the stop line the search is withheld from the upstream (translated to Chat
    Completions here, where the tool is the proxy's own copy) and the reply is the answer."""
    from keeper_middleware import KeeperConfig

    config = KeeperConfig(window=8192, search_budget=4)
    calls = {"n": 0}

    def never_stops(body: dict[str, Any]) -> Any:
        calls["n"] += 1
        return tool_reply(
            (f"s{calls['n']}", "search_archive", {"query": f"where {calls['n']}"}),
            text="Let me look once more.",
        )

    upstream = ScriptedUpstream(default=never_stops)
    app = make_app(upstream, tmp_path, window=8192, config=config)
    async with client_for(app) as client:
        if door == "responses":
            body = codex_body(user_item("Where is the key?"), stream=False)
        else:
            body = claude_body(stream=False)
        got = await client.post(f"/v1/{door}", json=body)
    assert got.status_code == 200, got.text
    assert "search_archive" not in got.text and "Let me look once more." in got.text
    offered = [[t["function"]["name"] for t in b.get("tools") or []] for b in upstream.work_calls]
    assert "search_archive" in offered[0] and "search_archive" not in offered[-1]
    assert len(upstream.work_calls) == config.search_budget + 2
    await app.state.proxy.aclose()
