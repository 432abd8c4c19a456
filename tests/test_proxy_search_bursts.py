"""Fifty parallel archive searches in a 4K window through the proxy: the searches the proxy
answers itself are folded like any round too big for the window, and the session goes on."""

from __future__ import annotations

import pytest

from tests.proxy_upstream import (
    chat,
    client_for,
    make_app,
    run_items,
    text_reply,
    tool_reply,
    upstream_fixture,  # noqa: F401
)

pytestmark = pytest.mark.anyio


async def test_fifty_parallel_searches_through_the_proxy_never_wedge_the_session(
    upstream, tmp_path
):
    app = make_app(upstream, tmp_path, window=4096)
    headers = {"X-Keeper-Session": "burst"}
    async with client_for(app) as client:
        history = await run_items(client, 12, "burst")
        burst = [(f"s{i:02d}", "search_archive", {"query": f"domo{i}"}) for i in range(50)]
        upstream.script = [tool_reply(*burst), text_reply("Found them.")]
        history.append({"role": "user", "content": "Search for every counter."})
        response = await client.post("/v1/chat/completions", json=chat(history), headers=headers)
        assert response.status_code == 200, response.text
        message = response.json()["choices"][0]["message"]
        assert message["content"] == "Found them."
        for n in range(2):  # two more inputs after the burst
            history += [message, {"role": "user", "content": f"Item {20 + n}: more."}]
            upstream.script = [text_reply("ok")]
            response = await client.post(
                "/v1/chat/completions", json=chat(history), headers=headers
            )
            assert response.status_code == 200, response.text
            message = response.json()["choices"][0]["message"]
    await app.state.proxy.aclose()
