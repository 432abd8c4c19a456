"""The proxy under hostile traffic: fifty parallel archive searches in a 4K
window are folded like any round too big for it, and a standing rule the user states reaches the
question whatever the note-taker writes."""

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


RULE = "From now on, always report every amount in euros."


async def test_a_rule_the_user_states_reaches_the_question_through_the_proxy_with_a_prose_note_taker(
    upstream, tmp_path
):
    upstream.notes_reply = lambda body: "I read the turns; nothing much changed."
    app = make_app(upstream, tmp_path, window=2048)
    headers = {"X-Keeper-Session": "rules"}
    async with client_for(app) as client:
        start = [{"role": "user", "content": "Task: keep the ledger."}]
        start.append({"role": "user", "content": "Item 0: Mira set c0 to 3. " + RULE})
        history = await run_items(client, 14, "rules", start=start)
        history.append({"role": "user", "content": "What is c1?"})
        response = await client.post("/v1/chat/completions", json=chat(history), headers=headers)
        assert response.status_code == 200, response.text
    assert app.state.proxy.keeper.counters("default:rules").cuts >= 3
    asked = upstream.work_calls[-1]["messages"]
    assert any(RULE in str(m.get("content")) for m in asked[-3:])  # beside the question
    await app.state.proxy.aclose()
