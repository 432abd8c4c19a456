"""The keeper proxy when the upstream fails: retries, clear errors, nothing lost, nothing twice."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from keeper_middleware.integrations.proxy import RetryPolicy
from tests.proxy_upstream import (
    SYSTEM,
    ScriptedUpstream,
    chat,
    client_for,
    convo,
    make_app,
    run_items,
    story,
    text_reply,
)

pytestmark = pytest.mark.anyio

HEADERS = {"X-Keeper-Session": "faulty"}


@pytest.fixture
def upstream() -> ScriptedUpstream:
    return ScriptedUpstream()


def down(request_body: dict[str, Any]) -> httpx.ConnectError:
    return httpx.ConnectError("connection refused")


async def post(client: httpx.AsyncClient, history: list[dict[str, Any]]) -> httpx.Response:
    return await client.post("/v1/chat/completions", json=chat(history), headers=HEADERS)


def user_texts(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "user"]


async def test_a_failing_upstream_is_retried_until_it_answers(upstream, tmp_path):
    upstream.script = [
        httpx.Response(500, json={"error": {"message": "boom"}}),
        httpx.Response(429),
        httpx.ReadTimeout("slow"),
        text_reply("finally"),
    ]
    app = make_app(upstream, tmp_path, retry=RetryPolicy(attempts=4, first_wait=0, max_wait=0))
    async with client_for(app) as client:
        response = await post(client, convo("Hi"))
    assert response.json()["choices"][0]["message"]["content"] == "finally"
    assert app.state.proxy.stats("default:faulty").upstream_retries == 3
    await app.state.proxy.aclose()


@pytest.mark.parametrize(
    ("failure", "status", "code"),
    [
        (down, 502, "upstream_unavailable"),
        (lambda body: httpx.ReadTimeout("slow"), 504, "upstream_timeout"),
        (lambda body: httpx.Response(429), 429, "upstream_overloaded"),
        (lambda body: httpx.Response(503), 503, "upstream_error"),
        (lambda body: httpx.Response(500, text="kaput"), 502, "upstream_error"),
        (lambda body: httpx.Response(200, text="not json"), 502, "upstream_bad_reply"),
    ],
)
async def test_an_upstream_that_stays_down_gets_a_clear_error(
    upstream, tmp_path, failure, status, code
):
    upstream.default = failure
    app = make_app(upstream, tmp_path)
    async with client_for(app) as client:
        response = await post(client, convo("Hi"))
        streamed = await client.post(
            "/v1/chat/completions", json=chat(convo("Hi"), stream=True), headers=HEADERS
        )
    for answer in (response, streamed):
        assert answer.status_code == status
        error = answer.json()["error"]
        assert error["code"] == code and error["type"] == "upstream_error" and error["message"]
    assert len(upstream.requests) == 2 * 3  # three tries each
    await app.state.proxy.aclose()


async def test_an_upstream_rejection_is_passed_on_without_retrying(upstream, tmp_path):
    upstream.default = lambda body: httpx.Response(
        400, json={"error": {"message": "tool schema invalid"}}
    )
    app = make_app(upstream, tmp_path)
    async with client_for(app) as client:
        response = await post(client, convo("Hi"))
    assert response.status_code == 400
    assert "tool schema invalid" in response.json()["error"]["message"]
    assert len(upstream.requests) == 1
    await app.state.proxy.aclose()


async def test_after_an_outage_the_retry_continues_without_loss_or_duplicates(upstream, tmp_path):
    app = make_app(upstream, tmp_path)
    async with client_for(app) as client:
        history = convo("Task: keep the ledger.", "ok", "Item 1: domo1 is 7.")
        assert (await post(client, history)).status_code == 200
        history += [
            {"role": "assistant", "content": "ok: Item 1: domo1 is 7."},
            {"role": "user", "content": "Item 2: domo2 is 9."},
        ]
        upstream.default = down
        assert (await post(client, history)).status_code == 502
        upstream.default = lambda body: text_reply("back")
        response = await post(client, history)
    assert response.json()["choices"][0]["message"]["content"] == "back"
    last = upstream.requests[-1]
    assert user_texts(last).count("Item 2: domo2 is 9.") == 1
    assert user_texts(last)[-1] == "Item 2: domo2 is 9."
    stats = app.state.proxy.stats("default:faulty")
    assert stats.failed_requests == 1
    assert stats.upstream_failures == stats.upstream_retries + 1  # every failed try, counted
    await app.state.proxy.aclose()


async def test_a_note_call_that_fails_loses_nothing(upstream, tmp_path):
    calls = {"notes": 0}

    def flaky_notes(body: dict[str, Any]) -> str:
        calls["notes"] += 1
        if calls["notes"] == 1:
            raise httpx.ConnectError("gone during notes")
        return "NO CHANGES"

    upstream.notes_reply = flaky_notes
    app = make_app(
        upstream, tmp_path, window=2048, retry=RetryPolicy(attempts=1, first_wait=0, max_wait=0)
    )
    async with client_for(app) as client:
        history = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Task: keep the ledger."},
        ]
        failed_once = False
        for i in range(1, 16):
            history.append({"role": "user", "content": story(i)})
            response = await post(client, history)
            if response.status_code == 502:
                failed_once = True
                response = await post(client, history)  # the agent retries as it is
            assert response.status_code == 200
            history.append(response.json()["choices"][0]["message"])
    keeper = app.state.proxy.keeper
    assert failed_once and keeper.counters("default:faulty").cuts >= 1
    archived = [t.content for t in keeper.archive.turns("default:faulty")]
    in_view = json.dumps(upstream.requests[-1]["messages"])
    for i in range(1, 16):
        here = sum(text.startswith(f"Item {i}:") for text in archived)
        assert here + in_view.count(f'"Item {i}: ') == 1, i
    await app.state.proxy.aclose()


async def test_a_new_app_on_the_same_folder_continues_every_session(upstream, tmp_path):
    first = make_app(upstream, tmp_path, window=2048)
    async with client_for(first) as client:
        history = await run_items(client, 10, "kept")
    kept = first.state.proxy.record("default:kept")
    assert first.state.proxy.keeper.counters("default:kept").cuts >= 1
    # the first app is never closed: a killed process does not clean up
    second = make_app(upstream, tmp_path, window=2048)
    restored = second.state.proxy
    assert restored.record("default:kept") == kept
    assert restored.keeper.notes("default:kept") == first.state.proxy.keeper.notes("default:kept")
    assert restored.keeper.counters("default:kept") == first.state.proxy.keeper.counters(
        "default:kept"
    )
    async with client_for(second) as client:
        history.append({"role": "user", "content": "Item 11: domo11 is 5."})
        response = await client.post(
            "/v1/chat/completions", json=chat(history), headers={"X-Keeper-Session": "kept"}
        )
    assert response.status_code == 200
    assert restored.record("default:kept").taken[: len(kept.taken)] == kept.taken
    assert (
        len(restored.record("default:kept").taken) == len(kept.taken) + 2
    )  # the item and the reply
    sent = upstream.work_calls[-1]["messages"]
    assert sent[0] == {"role": "system", "content": SYSTEM}
    assert sent[1]["content"] == "Task: keep the ledger."
    assert user_texts(upstream.work_calls[-1]).count("Item 11: domo11 is 5.") == 1
    await restored.aclose()


async def test_a_window_too_small_for_one_message_is_a_400(upstream, tmp_path):
    app = make_app(upstream, tmp_path, window=1024)
    async with client_for(app) as client:
        response = await post(client, convo("word " * 3000))
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"
    await app.state.proxy.aclose()
