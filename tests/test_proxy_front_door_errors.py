"""Errors at the Responses and Messages front doors come in each API's own shape, with the
status the chat door gives: a missing key, a body the proxy cannot read, an upstream that is
overloaded, a stream that breaks after its first byte, a tenant over its quota, a window too
small for what must stay in view. Claude Code retries with fewer beta fields on a 400, so a
field the proxy does not know is never a 400."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from keeper_middleware.integrations.proxy import Tenants
from tests.client_requests import claude_body, codex_body, user_item
from tests.proxy_upstream import ScriptedUpstream, client_for, make_app, text_reply

pytestmark = pytest.mark.anyio
KEY = {"authorization": "Bearer key-a"}


def anthropic_error(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert body["type"] == "error", body
    return dict(body["error"])


async def test_keys_are_read_from_x_api_key_too_and_refused_in_each_apis_shape(tmp_path):
    upstream = ScriptedUpstream()
    app = make_app(upstream, tmp_path, tenants=Tenants({"key-a": "acme"}))
    async with client_for(app) as client:
        missing = await client.post("/v1/messages", json=claude_body(stream=False))
        assert missing.status_code == 401
        assert anthropic_error(missing)["type"] == "authentication_error"
        assert "x-api-key" in anthropic_error(missing)["message"]
        for header in ({"x-api-key": "key-a"}, KEY):
            got = await client.post("/v1/messages", json=claude_body(stream=False), headers=header)
            assert got.status_code == 200, got.text
        refused = await client.post("/v1/responses", json=codex_body(user_item("x")))
        assert (
            refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
        )
    await app.state.proxy.aclose()


async def test_a_body_the_proxy_cannot_read_is_a_400_naming_the_field(tmp_path):
    app = make_app(ScriptedUpstream(), tmp_path)
    async with client_for(app) as client:
        bad = await client.post("/v1/messages", json={"model": "m", "messages": "hello"})
        assert bad.status_code == 400
        assert anthropic_error(bad) == {
            "type": "invalid_request_error",
            "message": "'messages' must be a non-empty list of messages.",
        }
        bad = await client.post("/v1/responses", json={"model": "m", "input": 7})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"
        weird = {"type": "weird_item", "text": "kept nowhere"}
        bad = await client.post("/v1/responses", json=codex_body(user_item("x"), weird))
        assert bad.status_code == 400, bad.text
        assert bad.json()["error"]["param"] == "input[4].type"
        assert "'weird_item'" in bad.json()["error"]["message"]
        not_json = await client.post("/v1/messages", content=b"{")
        assert (
            not_json.status_code == 400 and "not valid JSON" in anthropic_error(not_json)["message"]
        )
        # what Claude Code adds as it goes is passed on, not refused
        future = claude_body(stream=False) | {"brand_new": {"x": 1}, "thinking": {"type": "new"}}
        assert (await client.post("/v1/messages", json=future)).status_code == 200
    await app.state.proxy.aclose()


async def test_an_overloaded_upstream_is_a_429_with_retry_after_in_each_shape(tmp_path):
    busy = httpx.Response(429, headers={"retry-after": "30"}, json={"error": {"message": "busy"}})
    upstream = ScriptedUpstream(script=[busy, busy])
    app = make_app(upstream, tmp_path)
    async with client_for(app) as client:
        messages = await client.post("/v1/messages", json=claude_body(stream=True))
        assert messages.status_code == 429 and messages.headers["retry-after"] == "30"
        assert anthropic_error(messages)["type"] == "rate_limit_error"
        responses = await client.post("/v1/responses", json=codex_body(user_item("x")))
        assert responses.status_code == 429 and responses.headers["retry-after"] == "30"
        assert responses.json()["error"]["code"] == "upstream_overloaded"
    await app.state.proxy.aclose()


def cut_short(text: str) -> httpx.Response:
    """A stream that sends some text and ends without a finish reason or [DONE]."""
    chunk = {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"content": text}}]}
    return httpx.Response(
        200, content=f"data: {json.dumps(chunk)}\n\n".encode(),
        headers={"content-type": "text/event-stream"},
    )  # fmt: skip


async def test_a_stream_broken_after_its_first_byte_ends_with_the_apis_error_event(tmp_path):
    upstream = ScriptedUpstream(script=[cut_short("Half an answ"), cut_short("Half an answ")])
    app = make_app(upstream, tmp_path)
    async with client_for(app) as client:
        got = await client.post("/v1/messages", json=claude_body(stream=True))
        lines = got.text.splitlines()
        assert lines[0] == "event: message_start"
        assert "event: error" in lines and "event: message_stop" not in lines
        error = json.loads(lines[lines.index("event: error") + 1].removeprefix("data: "))
        assert error["error"]["type"] == "api_error" and "ended before" in error["error"]["message"]
        got = await client.post("/v1/responses", json=codex_body(user_item("x")))
        kinds = [
            line.removeprefix("event: ")
            for line in got.text.splitlines()
            if line.startswith("event: ")
        ]
        assert kinds[0] == "response.created" and kinds[-2:] == ["error", "response.failed"]
        assert "response.completed" not in kinds
    await app.state.proxy.aclose()


async def test_a_tenant_over_its_quota_and_a_window_too_small_are_refused_and_store_nothing(
    tmp_path,
):
    app = make_app(ScriptedUpstream(), tmp_path, tenant_quota_bytes=200)
    async with client_for(app) as client:
        big = claude_body(stream=False)
        big["messages"][0]["content"][1]["text"] = "x" * 5000
        over = await client.post("/v1/messages", json=big)
        assert over.status_code == 413 and anthropic_error(over)["type"] == "request_too_large"
        assert (await client.get("/keeper/sessions")).json() == {"sessions": []}
    await app.state.proxy.aclose()
    app = make_app(ScriptedUpstream(), tmp_path / "small", window=1024)
    async with client_for(app) as client:
        body = codex_body(user_item("x"))
        body["input"][0]["content"][0]["text"] = "You are careful. " * 400
        small = await client.post("/v1/responses", json=body)
        assert small.status_code == 400
        assert small.json()["error"]["code"] == "context_length_exceeded"
        assert (await client.get("/keeper/sessions")).json() == {"sessions": []}
    await app.state.proxy.aclose()


async def test_responses_the_proxy_does_not_keep_are_a_404_after_the_key_check(tmp_path):
    app = make_app(ScriptedUpstream(), tmp_path, tenants=Tenants({"key-a": "acme"}))
    async with client_for(app) as client:
        anonymous = await client.get("/v1/responses/resp_1")
        assert anonymous.status_code == 401
        for method in ("GET", "DELETE"):
            got = await client.request(method, "/v1/responses/resp_1", headers=KEY)
            assert got.status_code == 404 and "keeps no responses" in got.json()["error"]["message"]
        listed = await client.get("/v1/responses/resp_1/input_items", headers=KEY)
        assert listed.status_code == 404
    await app.state.proxy.aclose()


async def test_count_tokens_is_the_keepers_own_count(tmp_path):
    app = make_app(ScriptedUpstream(), tmp_path)
    async with client_for(app) as client:
        small = await client.post("/v1/messages/count_tokens", json=claude_body(stream=False))
        body = claude_body(stream=False)
        body["messages"][0]["content"][1]["text"] = "word " * 1000
        large = await client.post("/v1/messages/count_tokens", json=body)
    assert small.status_code == 200
    assert 0 < small.json()["input_tokens"] < large.json()["input_tokens"] - 900
    await app.state.proxy.aclose()


async def test_a_chat_upstream_gets_no_field_it_may_refuse(tmp_path):
    upstream = ScriptedUpstream(default=lambda body: text_reply("ok"))
    app = make_app(upstream, tmp_path)
    async with client_for(app) as client:
        got = await client.post("/v1/messages", json=claude_body(stream=False) | {"speed": "fast"})
        assert got.status_code == 200
    sent = upstream.work_calls[-1]
    assert not {"thinking", "context_management", "output_config", "speed", "metadata"} & set(sent)
    assert sent["max_tokens"] <= 4096 and sent["user"].startswith('{"device_id"')
    await app.state.proxy.aclose()
