"""Several users: keys map to tenants, sessions never cross tenants, sessions can be forgotten,
refused requests store nothing, and every model-supplied search argument gets an answer."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from keeper_middleware.integrations.proxy.sessions.searching import search_arguments
from keeper_middleware.integrations.proxy.sessions.tenants import Tenants, parse_keys
from tests.proxy_upstream import (
    ScriptedUpstream,
    chat,
    client_for,
    completion,
    convo,
    make_app,
    run_items,
    text_reply,
    tool_reply,
)

pytestmark = pytest.mark.anyio

KEYS = {"key-a1": "acme", "key-a2": "acme", "key-b": "beta"}


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@pytest.fixture
def upstream() -> ScriptedUpstream:
    return ScriptedUpstream()


async def test_two_tenants_opening_alike_never_share_a_session(upstream, tmp_path):
    app = make_app(upstream, tmp_path, tenants=Tenants(KEYS))
    async with client_for(app) as client:
        secret = convo("Hello", "Hi!", "My secret is 4711.")
        await client.post("/v1/chat/completions", json=chat(secret), headers=bearer("key-a1"))
        await client.post(
            "/v1/chat/completions", json=chat(convo("Hello")), headers=bearer("key-b")
        )
    beta_request = upstream.work_calls[-1]["messages"]
    assert "4711" not in json.dumps(beta_request)
    names = app.state.proxy.sessions()
    assert len(names) == 2 and {n.split(":")[0] for n in names} == {"acme", "beta"}
    await app.state.proxy.aclose()


async def test_a_tenants_keys_share_its_sessions_and_only_its_own(upstream, tmp_path):
    app = make_app(upstream, tmp_path, tenants=Tenants(KEYS, admin_keys=["root"]))
    named = {"X-Keeper-Session": "s1"}
    async with client_for(app) as client:
        await client.post(
            "/v1/chat/completions",
            json=chat(convo("A's work")),
            headers={**bearer("key-a1"), **named},
        )
        own = await client.get("/keeper/sessions/s1", headers=bearer("key-a2"))
        other = await client.get("/keeper/sessions/s1", headers=bearer("key-b"))
        listed = await client.get("/keeper/sessions", headers=bearer("key-b"))
        admin = await client.get("/keeper/sessions/acme:s1", headers=bearer("root"))
        everything = await client.get("/keeper/sessions", headers=bearer("root"))
        # B naming A's session id gets its own, empty session: nothing of A's reaches it
        await client.post(
            "/v1/chat/completions",
            json=chat(convo("B's work")),
            headers={**bearer("key-b"), **named},
        )
        wrong = await client.get("/keeper/sessions", headers=bearer("nope"))
    assert own.status_code == 200 and own.json()["agent_messages"] == 2
    assert other.status_code == 404 and listed.json() == {"sessions": []}
    assert admin.status_code == 200
    assert everything.json() == {"sessions": ["acme:s1"]}
    assert "A's work" not in json.dumps(upstream.work_calls[-1]["messages"])
    assert wrong.status_code == 401
    await app.state.proxy.aclose()


async def test_delete_forgets_archive_notes_and_index_of_the_callers_session(upstream, tmp_path):
    app = make_app(upstream, tmp_path, window=2048, tenants=Tenants(KEYS))
    proxy = app.state.proxy
    async with client_for(app) as client:
        client.headers.update(bearer("key-a1"))
        await run_items(client, 12, "gone")
        assert proxy.keeper.archive.turn_count("acme:gone") > 0
        assert proxy.keeper.retriever.count("acme:gone") > 0
        refused = await client.delete("/keeper/sessions/gone", headers=bearer("key-b"))
        deleted = await client.delete("/keeper/sessions/gone")
        again = await client.delete("/keeper/sessions/gone")
        after = await client.get("/keeper/sessions/gone")
    assert refused.status_code == 404 and deleted.json() == {"session": "gone", "deleted": True}
    assert again.status_code == 404 and after.status_code == 404
    assert proxy.keeper.archive.turn_count("acme:gone") == 0
    assert proxy.keeper.archive.latest_notes("acme:gone") is None
    assert proxy.keeper.retriever.count("acme:gone") == 0
    assert "acme:gone" not in proxy.sessions()
    await proxy.aclose()


async def test_metrics_carry_no_session_ids_and_may_need_their_own_key(upstream, tmp_path):
    tenants = Tenants(KEYS, metrics_keys=["scrape"])
    app = make_app(upstream, tmp_path, tenants=tenants)
    async with client_for(app) as client:
        await client.post(
            "/v1/chat/completions",
            json=chat(convo("Hi")),
            headers={**bearer("key-a1"), "X-Keeper-Session": "private-name"},
        )
        denied = await client.get("/metrics", headers=bearer("key-a1"))
        metrics = await client.get("/metrics", headers=bearer("scrape"))
        chat_with_scrape = await client.post(
            "/v1/chat/completions", json=chat(convo("Hi")), headers=bearer("scrape")
        )
    assert denied.status_code == 403 and chat_with_scrape.status_code == 403
    assert metrics.status_code == 200 and "private-name" not in metrics.text
    lines = [line for line in metrics.text.splitlines() if line.startswith("keeper_proxy_requests")]
    assert lines == ['keeper_proxy_requests_total{tenant="acme"} 1.0']
    await app.state.proxy.aclose()


async def test_requiring_a_session_or_user_refuses_anonymous_requests(upstream, tmp_path):
    app = make_app(upstream, tmp_path, require_session=True)
    async with client_for(app) as client:
        anonymous = await client.post("/v1/chat/completions", json=chat(convo("Hello")))
        alice = await client.post("/v1/chat/completions", json=chat(convo("Hello"), user="alice"))
        bob = await client.post("/v1/chat/completions", json=chat(convo("Hello"), user="bob"))
    assert anonymous.status_code == 400 and "X-Keeper-Session" in anonymous.text
    assert alice.headers["x-keeper-session"] != bob.headers["x-keeper-session"]
    assert app.state.proxy.sessions() == sorted(
        f"default:{r.headers['x-keeper-session']}" for r in (alice, bob)
    )
    await app.state.proxy.aclose()


def test_keys_come_from_a_file_and_the_environment_and_are_never_shown(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# tenant key\nacme sk-one\nacme sk-two\n\nbeta sk-three\n")
    tenants = Tenants.from_sources(keys_file=path, environ={"KEEPER_PROXY_KEYS": "gamma:sk-4"})
    assert tenants.identify("Bearer sk-two").tenant == "acme"
    assert tenants.identify("Bearer sk-4").tenant == "gamma"
    assert tenants.identify("Bearer sk-5") is None and tenants.identify(None) is None
    assert "sk-" not in repr(tenants) + repr(vars(tenants))
    with pytest.raises(ValueError, match="two tenants"):
        parse_keys("a k\nb k\n", source="keys")
    with pytest.raises(ValueError, match="entry 1"):
        parse_keys("bad/name k\n", source="keys")


async def test_a_request_refused_for_its_size_stores_nothing(upstream, tmp_path):
    app = make_app(upstream, tmp_path, window=2048)
    # a long input is excerpted, not refused: only a fixed part that cannot fit is refused
    huge = [{"role": "system", "content": "Rule " * 5000}, {"role": "user", "content": "Task."}]
    async with client_for(app) as client:
        for _ in range(3):
            response = await client.post("/v1/chat/completions", json=chat(huge))
            assert response.status_code == 400
            assert response.json()["error"]["code"] == "context_length_exceeded"
        too_long = await client.post(
            "/v1/chat/completions", content=b"x" * 2000, headers={"content-length": "2000"}
        )
    assert app.state.proxy.sessions() == []
    await app.state.proxy.aclose()
    app = make_app(upstream, tmp_path, max_body_bytes=1000)
    async with client_for(app) as client:
        too_long = await client.post("/v1/chat/completions", json=chat(convo("x" * 2000)))
    assert too_long.status_code == 413 and app.state.proxy.sessions() == []
    await app.state.proxy.aclose()


async def test_a_tenant_over_its_quota_gets_a_413_and_can_free_space(upstream, tmp_path):
    app = make_app(upstream, tmp_path, tenants=Tenants(KEYS), tenant_quota_bytes=3000)
    async with client_for(app) as client:
        first = await client.post(
            "/v1/chat/completions",
            json=chat(convo("a" * 2000)),
            headers={**bearer("key-a1"), "X-Keeper-Session": "big"},
        )
        over = await client.post(
            "/v1/chat/completions",
            json=chat(convo("b" * 2000)),
            headers={**bearer("key-a2"), "X-Keeper-Session": "more"},
        )
        other_tenant = await client.post(
            "/v1/chat/completions", json=chat(convo("c" * 2000)), headers=bearer("key-b")
        )
        await client.delete("/keeper/sessions/big", headers=bearer("key-a1"))
        after = await client.post(
            "/v1/chat/completions",
            json=chat(convo("b" * 2000)),
            headers={**bearer("key-a2"), "X-Keeper-Session": "more"},
        )
    assert first.status_code == 200 and other_tenant.status_code == 200
    assert over.status_code == 413 and over.json()["error"]["code"] == "quota_exceeded"
    assert "acme:more" not in app.state.proxy.sessions() or after.status_code == 200
    assert after.status_code == 200
    await app.state.proxy.aclose()


BAD_ARGUMENTS = [
    {"query": "x", "from_item": 5, "to_item": 2},
    {"query": "x", "from_item": 1e400},
    {"query": "x", "from_item": 10**30},
    {"query": "x", "to_item": "ten"},
    {"query": "x", "from_item": -3},
    {"query": ["x"]},
    {"query": ""},
    {"query": "x", "from_item": True},
    {"query": "x", "from_item": float("nan")},
]


@pytest.mark.parametrize("args", BAD_ARGUMENTS)
def test_every_bad_search_argument_is_refused_in_words(args):
    refusal = search_arguments(args)
    assert isinstance(refusal, str) and refusal.startswith("Refused:")


async def test_bad_search_arguments_reach_the_model_as_refusals_never_a_500(upstream, tmp_path):
    app = make_app(upstream, tmp_path)
    calls = [(f"s{i}", "search_archive", args) for i, args in enumerate(BAD_ARGUMENTS)]

    def big_numbers(body: dict[str, Any]) -> dict[str, Any]:
        reply = tool_reply(*calls)
        for call, args in zip(
            reply["choices"][0]["message"]["tool_calls"], BAD_ARGUMENTS, strict=True
        ):
            if isinstance(args.get("from_item"), float) and args["from_item"] != args["from_item"]:
                call["function"]["arguments"] = '{"query": "x", "from_item": NaN}'
            elif args.get("from_item") == 1e400:
                call["function"]["arguments"] = '{"query": "x", "from_item": 1e400}'
        return reply

    upstream.script = [big_numbers, text_reply("done")]
    async with client_for(app) as client:
        response = await client.post("/v1/chat/completions", json=chat(convo("Go")))
    assert response.status_code == 200
    results = [m for m in upstream.work_calls[1]["messages"] if m["role"] == "tool"]
    assert len(results) == len(BAD_ARGUMENTS)
    assert all(m["content"].startswith("Refused:") for m in results)
    await app.state.proxy.aclose()


async def test_usage_sums_the_turns_calls_and_max_tokens_fits_the_reserve(upstream, tmp_path):
    app = make_app(upstream, tmp_path)
    upstream.script = [
        tool_reply(("s1", "search_archive", {"query": "x"})),
        completion({"role": "assistant", "content": "found"}, prompt=300),
    ]
    async with client_for(app) as client:
        response = await client.post(
            "/v1/chat/completions", json=chat(convo("Go"), max_tokens=10**6)
        )
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] == 100 + 300
    reserve = app.state.proxy.keeper.config.reply_reserve
    assert {b["max_tokens"] for b in upstream.work_calls} == {reserve}
    await app.state.proxy.aclose()


async def test_retry_after_is_honoured_and_sent(tmp_path):
    from keeper_middleware.integrations.proxy import RetryPolicy

    upstream = ScriptedUpstream(
        default=lambda body: httpx.Response(429, headers={"retry-after": "7"}, json={})
    )
    quick = RetryPolicy(attempts=3, first_wait=0.0, max_wait=0.0, budget=5.0, timeout=5.0)
    app = make_app(upstream, tmp_path, retry=quick)
    async with client_for(app) as client:
        response = await client.post("/v1/chat/completions", json=chat(convo("Hi")))
    # waiting 7 s would pass the 5 s budget: no retry, and the agent is told to come back in 7
    assert response.status_code == 429 and response.headers["retry-after"] == "7"
    assert len(upstream.requests) == 1
    stats = app.state.proxy.stats(app.state.proxy.sessions()[0])
    assert stats.upstream_calls == 1 and stats.upstream_failures == 1
    await app.state.proxy.aclose()


def test_a_plain_answer_streams_before_the_upstream_finishes(tmp_path):
    """Over real sockets: the upstream sends one piece of text, then waits until the agent has
    read it; only a proxy that streams as it receives lets the answer finish."""
    import asyncio
    import threading

    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    from keeper_middleware.integrations.proxy import create_proxy_app
    from keeper_middleware.integrations.proxy.cli import serve_in_thread

    seen = threading.Event()

    async def pieces():
        head = {"id": "x", "model": "m", "created": 1}
        for text, last in (("Hel", False), ("lo", True)):
            choice = {
                "index": 0,
                "delta": {"content": text},
                "finish_reason": "stop" if last else None,
            }
            yield f"data: {json.dumps({**head, 'choices': [choice]})}\n\n"
            for _ in range(1000):
                if seen.is_set() or last:
                    break
                await asyncio.sleep(0.01)
        yield "data: [DONE]\n\n"

    async def chat_route(request: Request) -> Response:
        body = json.loads(await request.body())
        if not body.get("stream"):
            return JSONResponse(text_reply("NO CHANGES"))
        return StreamingResponse(pieces(), media_type="text/event-stream")

    upstream_app = Starlette(routes=[Route("/v1/chat/completions", chat_route, methods=["POST"])])
    texts: list[str] = []
    with serve_in_thread(upstream_app) as upstream_url:
        app = create_proxy_app(upstream_url, window=32_768, archive_dir=tmp_path)
        with serve_in_thread(app) as url, httpx.Client(timeout=30) as client:
            body = chat(convo("Hi"), stream=True)
            with client.stream("POST", f"{url}/chat/completions", json=body) as response:
                for line in response.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    choices = json.loads(line[6:])["choices"]
                    if choices and choices[0]["delta"].get("content"):
                        texts.append(choices[0]["delta"]["content"])
                        seen.set()
    assert texts == ["Hel", "lo"]
    assert seen.is_set()


async def test_a_streamed_search_is_never_shown_to_the_agent(upstream, tmp_path):
    app = make_app(upstream, tmp_path)
    upstream.script = [tool_reply(("s1", "search_archive", {"query": "x"})), text_reply("Answer.")]
    async with client_for(app) as client:
        response = await client.post("/v1/chat/completions", json=chat(convo("Go"), stream=True))
    assert "search_archive" not in response.text
    text = "".join(
        json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
        for line in response.text.splitlines()
        if line.startswith("data: {") and json.loads(line[6:])["choices"]
    )
    assert text == "Answer."
    await app.state.proxy.aclose()
