"""Responses ids are opaque: random, kept in the archive (restart-stable, shared by replicas on
one database), resolved only for their own tenant; another tenant's id gets the unknown-id error
byte for byte. Ids of the earlier form (the session's name in hex) still continue.

Runs on SQLite and, in the postgres tier, on PostgreSQL (``conftest.PROXY_SUITES``).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import pytest

from keeper_middleware.archive.sqlite import SQLiteArchive
from keeper_middleware.integrations.proxy import Tenants
from keeper_middleware.integrations.proxy.conversation.form import RequestError
from keeper_middleware.integrations.proxy.doors.response_ids import ResponseIds
from tests.proxy_upstream import ScriptedUpstream, client_for, make_app, text_reply

pytestmark = pytest.mark.anyio
OPAQUE = re.compile(r"resp_[0-9a-f]{32}")
NAMES = ("alice-taxes-2026", "Заметки-Алисы", "会话-四十二", "ملاحظات-المشروع", "Ωmega.δ")
KEYS = {"key-a": "acme", "key-b": "beta"}


def traces(name: str) -> list[str]:
    """What an id that carried ``name`` would show of it: the name, its UTF-8 in hex (whole and
    in pieces of four bytes), its SHA-256."""
    raw = name.encode()
    pieces = [raw[i : i + 4].hex() for i in range(0, max(len(raw) - 3, 1))]
    return [name, raw.hex(), hashlib.sha256(raw).hexdigest()[:16], *pieces]


def ask(prompt: str, previous: str | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "input": prompt, "stream": False, **extra}
    if previous is not None:
        body["previous_response_id"] = previous
    return body


def as_tenant(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def test_an_issued_id_shows_nothing_of_its_session(tmp_path):
    with SQLiteArchive(tmp_path / "a.sqlite3") as archive:
        ids = ResponseIds(archive)
        for name in NAMES:
            first, reply = ids.issue("acme", name, stored=True)
            second, _ = ids.issue("acme", name, stored=True)
            for answer in (first, second):
                assert OPAQUE.fullmatch(answer), answer
                assert not any(trace in answer for trace in traces(name))
            assert first != second
            assert ids.resolve("acme", first) == (name, reply)


async def test_ids_through_the_door_are_opaque_and_continue_their_session(tmp_path):
    app = make_app(ScriptedUpstream(default=lambda body: text_reply("noted")), tmp_path)
    async with client_for(app) as client:
        for name in NAMES:
            first = await client.post("/v1/responses", json=ask("hi", prompt_cache_key=name))
            assert first.status_code == 200, first.text
            answer = first.json()["id"]
            session = first.headers["x-keeper-session"]
            assert OPAQUE.fullmatch(answer)
            assert not any(t in answer for t in (*traces(name), *traces(session)))
            again = await client.post("/v1/responses", json=ask("and then?", answer))
            assert again.status_code == 200, again.text
            assert again.headers["x-keeper-session"] == session
    await app.state.proxy.aclose()


async def test_an_id_continues_after_the_proxy_restarts_on_the_same_archive(tmp_path):
    upstream = ScriptedUpstream(default=lambda body: text_reply("noted"))
    before = make_app(upstream, tmp_path)
    async with client_for(before) as client:
        first = await client.post("/v1/responses", json=ask("remember BLUE-7"))
        answer, session = first.json()["id"], first.headers["x-keeper-session"]
    await before.state.proxy.aclose()
    after = make_app(upstream, tmp_path)  # a new process on the same archive
    async with client_for(after) as client:
        again = await client.post("/v1/responses", json=ask("what did I say?", answer))
        assert again.status_code == 200, again.text
        assert again.headers["x-keeper-session"] == session
        (name,) = after.state.proxy.sessions()
        assert after.state.proxy.stats(name).withdrawn_messages == 0
    await after.state.proxy.aclose()


async def test_another_tenants_id_reads_exactly_like_an_unknown_one(tmp_path):
    upstream = ScriptedUpstream(default=lambda body: text_reply("noted"))
    app = make_app(upstream, tmp_path, tenants=Tenants(KEYS))

    async def post(key: str, prompt: str, previous: str | None = None, **extra: Any) -> Any:
        body = ask(prompt, previous, **extra)
        return await client.post("/v1/responses", json=body, headers=as_tenant(key))

    async with client_for(app) as client:
        answer = (await post("key-a", "hi")).json()["id"]
        given = {"theirs": answer, "never": "resp_" + "0" * 32, "short": "resp_123"}
        told = {label: await post("key-b", "next", value) for label, value in given.items()}
        assert {r.status_code for r in told.values()} == {400}
        assert told["theirs"].content == told["never"].content == told["short"].content
        assert b"not known to this proxy" in told["never"].content
        assert (await post("key-a", "next", answer)).status_code == 200  # still its tenant's
        unstored = (await post("key-a", "hi", store=False)).json()["id"]
        assert (await post("key-b", "next", unstored)).content == told["never"].content
        own = await post("key-a", "next", unstored)
        assert own.status_code == 400 and "store=false" in own.json()["error"]["message"]
    await app.state.proxy.aclose()


async def test_forgetting_a_session_forgets_its_ids(tmp_path):
    app = make_app(ScriptedUpstream(default=lambda body: text_reply("noted")), tmp_path)
    async with client_for(app) as client:
        first = await client.post("/v1/responses", json=ask("hi"))
        answer, session = first.json()["id"], first.headers["x-keeper-session"]
        assert (await client.delete(f"/keeper/sessions/{session}")).status_code == 200
        again = await client.post("/v1/responses", json=ask("next", answer))
        assert again.status_code == 400
        assert again.json()["error"]["code"] == "previous_response_not_found"
    await app.state.proxy.aclose()


async def test_an_id_of_the_earlier_form_still_continues_its_session(tmp_path):
    app = make_app(ScriptedUpstream(default=lambda body: text_reply("noted")), tmp_path)
    async with client_for(app) as client:
        headers = {"x-keeper-session": "ledger-1"}
        await client.post("/v1/responses", json=ask("hi"), headers=headers)
        (name,) = app.state.proxy.sessions()
        reply = app.state.proxy.record(name).taken[-1][1]  # the latest reply's id: r-<nonce>
        earlier = f"resp_k{b'ledger-1'.hex()}.{reply.removeprefix('r-')}"
        again = await client.post("/v1/responses", json=ask("next", earlier))
        assert again.status_code == 200, again.text
        assert again.headers["x-keeper-session"] == "ledger-1"
    await app.state.proxy.aclose()


def test_malformed_and_unstored_ids_of_the_earlier_form_are_refused(tmp_path):
    with SQLiteArchive(tmp_path / "a.sqlite3") as archive:
        ids = ResponseIds(archive)
        with pytest.raises(RequestError, match="store=false"):
            ids.resolve("acme", f"resp_x{b'codex-1'.hex()}.ab12")
        for forged in ("resp_abc", "resp_kzz.1", "chatcmpl-1", f"resp_k{b'a:b'.hex()}.1", ""):
            with pytest.raises(RequestError, match="not known to this proxy"):
                ids.resolve("acme", forged)
