"""Bad requests get a clear JSON error and never reach the model server: malformed bodies are a
4xx naming what is wrong, an oversized body a 413, a missing API key a 401 on every route when
one is set (and the key is not passed upstream), and unknown routes a JSON 404."""

from __future__ import annotations

import pytest

from tests.proxy_upstream import (
    chat,
    client_for,
    convo,
    make_app,
    proxy_fixture,  # noqa: F401
    upstream_fixture,  # noqa: F401
)

pytestmark = pytest.mark.anyio


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
