"""Through the proxy the keeper holds the upstream to the window: no request is larger than the
budget however long the session runs, note calls are rendered like the main calls and extend
what the server has already read (so its prefix cache serves them), and the RULES from the NOTES
are repeated next to a new question."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import convert_to_messages

from keeper_middleware.tokens.counting import ApproximateTokenCounter
from tests.proxy_upstream import (
    SYSTEM,
    chat,
    client_for,
    is_note_call,
    make_app,
    run_items,
    upstream_fixture,  # noqa: F401
)

pytestmark = pytest.mark.anyio


# ----------------------------------------------------------------------------- the window


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
