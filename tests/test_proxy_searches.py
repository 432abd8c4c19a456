"""The proxy answers the model's archive searches itself and hands the agent only its own tool
calls: a search is run inside the proxy and its results sent back upstream, a reply mixing both
kinds is kept whole, results of a turn that ended empty are shown again, an agent tool that
happens to share the search tool's name is the agent's, and the search loop is bounded."""

from __future__ import annotations

from typing import Any

import pytest

from tests.proxy_upstream import (
    AGENT_TOOL,
    chat,
    client_for,
    convo,
    make_app,
    proxy_fixture,  # noqa: F401
    run_items,
    text_reply,
    tool_reply,
    upstream_fixture,  # noqa: F401
)

pytestmark = pytest.mark.anyio


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
    found = after[-1]["content"]
    assert "item 2: " in found and "Item 2: The clerk recorded domo2 at 14." in found
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
