"""A session is named by the ``X-Keeper-Session`` header (or, without one, by a hash of the
conversation's opening), and sessions never see each other's messages. Within a session the
history the agent resends is matched by content: resent messages are not taken in twice, an edit
replaces the old message in view (or, for an archived one, comes in as new input alone), a
regenerated reply withdraws the previous one, and overlapping requests run one at a time."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest

from keeper_middleware.integrations.proxy import create_proxy_app
from tests.proxy_upstream import (
    SYSTEM,
    chat,
    client_for,
    convo,
    make_app,
    proxy_fixture,  # noqa: F401
    run_items,
    story,
    text_reply,
    upstream_fixture,  # noqa: F401
)

pytestmark = pytest.mark.anyio


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


async def test_a_chat_ui_edit_withdraws_what_followed_and_keeps_what_was_archived(
    upstream, tmp_path
):
    """The proxy guide's (docs/proxy.md) "edit a message": a chat UI resends the history up to the edited message,
    changed. The messages after it still in view are withdrawn, the edited one is new input, and
    whatever a cut had archived stays archived (one memory per session, never edited)."""
    app = make_app(upstream, tmp_path, window=2048)
    keeper = app.state.proxy.keeper
    history = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Task: keep the ledger."},
    ]

    def archived_items() -> set[int]:
        found = (re.match(r"Item (\d+):", t.content) for t in keeper.archive.turns("default:ui"))
        return {int(m.group(1)) for m in found if m}

    async with client_for(app) as client:
        for number in range(1, 40):  # until a cut has archived items and two are still in view
            history.append({"role": "user", "content": story(number)})
            response = await client.post(
                "/v1/chat/completions", json=chat(history), headers={"X-Keeper-Session": "ui"}
            )
            history.append(response.json()["choices"][0]["message"])
            if archived_items() and not archived_items() & {number - 1, number}:
                break
        edited_item = number - 1  # still in view, with its reply and one more item after it
        assert 1 in archived_items() and edited_item not in archived_items()
        archived = [t.content for t in keeper.archive.turns("default:ui")]
        at = next(
            i
            for i, m in enumerate(history)
            if m["role"] == "user" and str(m["content"]).startswith(f"Item {edited_item}:")
        )
        correction = f"Item {edited_item}: correction, domo{edited_item} was 4."
        edited = [*history[:at], {"role": "user", "content": correction}]
        response = await client.post(
            "/v1/chat/completions", json=chat(edited), headers={"X-Keeper-Session": "ui"}
        )
    assert response.status_code == 200
    sent = [m.get("content") or "" for m in upstream.work_calls[-1]["messages"]]
    assert sent[-1] == correction
    assert sum(text.startswith(f"Item {edited_item}:") for text in sent) == 1
    assert not any(text.startswith(f"Item {number}:") for text in sent)
    after = [t.content for t in keeper.archive.turns("default:ui")]
    assert after[: len(archived)] == archived
    assert (
        app.state.proxy.stats("default:ui").withdrawn_messages >= 3
    )  # the item, its reply, the next
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
