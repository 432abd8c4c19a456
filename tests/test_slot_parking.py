"""Slot parking through the proxy, against a scripted llama-server (an httpx.MockTransport).

``SlotServer`` plays the parts of llama-server that parking touches, the way llama-server does
them: slots hold token lists; a chat request pinned to a slot (``id_slot``) keeps the longest
common prefix of the slot's tokens and the prompt, reads the rest and reports ``timings``;
``/slots/{id}?action=save`` writes a real ``'ggsq'`` file (header, token ids, filler standing for
the KV state) into the slot folder and ``restore`` reads it back; ``/props``, ``/v1/models``,
``/apply-template`` and ``/tokenize`` answer as the server does. The real server is exercised by
``tests/test_real_server_slots.py``.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any

import httpx
import pytest

from keeper_middleware.integrations.proxy import RetryPolicy, create_proxy_app
from keeper_middleware.integrations.proxy.cli import build_parser, byte_size, slot_parking_config
from keeper_middleware.integrations.proxy.slots.parking import SlotParkingConfig
from keeper_middleware.integrations.proxy.slots.rules import parked_name

pytestmark = pytest.mark.anyio

FAST_RETRY = RetryPolicy(attempts=1, first_wait=0.0, max_wait=0.0, budget=5.0, timeout=5.0)
KV_BYTES_PER_TOKEN = 40


class SlotServer:
    """What llama-server does with slots, prompts and slot files (see the module docstring)."""

    def __init__(self, folder: Path, *, slots: int = 1, ctx: int = 8192) -> None:
        self.folder = folder
        self.slots: list[list[int]] = [[] for _ in range(slots)]
        self.ctx = ctx
        self.build = "b1-test"
        self.actions: list[tuple[str, int]] = []
        self.chats: list[dict[str, Any]] = []

    @staticmethod
    def tokens(text: str) -> list[int]:
        return [zlib.crc32(word.encode()) % 50_000 for word in text.split()]

    @staticmethod
    def template(messages: list[dict[str, Any]]) -> str:
        return " ".join(f"<{m['role']}> {m.get('content') or ''}" for m in messages) + " <reply>"

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        body = json.loads(request.content) if request.content else {}
        if path == "/props":
            return httpx.Response(
                200,
                json={
                    "build_info": self.build,
                    "model_path": str(self.folder / "no-such-model.gguf"),
                    "total_slots": len(self.slots),
                    "default_generation_settings": {"n_ctx": self.ctx},
                },
            )
        if path == "/v1/models":
            meta = {"vocab_type": 2, "n_vocab": 50_000, "n_params": 1, "n_embd": 8, "size": 99}
            return httpx.Response(200, json={"data": [{"id": "m", "meta": meta}]})
        if path == "/apply-template":
            return httpx.Response(200, json={"prompt": self.template(body["messages"])})
        if path == "/tokenize":
            return httpx.Response(200, json={"tokens": self.tokens(body["content"])})
        if path.startswith("/slots/"):
            return self.slot_action(int(path.rsplit("/", 1)[1]), request.url.params["action"], body)
        if path == "/v1/chat/completions":
            return self.chat(body)
        return httpx.Response(404, json={"error": {"message": f"no {path}"}})

    def slot_action(self, slot: int, action: str, body: dict[str, Any]) -> httpx.Response:
        self.actions.append((action, slot))
        if action == "erase":
            self.slots[slot] = []
            return httpx.Response(200, json={"id_slot": slot, "n_erased": 0})
        path = self.folder / body["filename"]
        if action == "save":
            held = self.slots[slot]
            record = [-1, 1, len(held), *held, 0]  # llama-server's token record
            state = struct.pack(f"<III{len(record)}i", 0x67677371, 4, len(record), *record)
            path.write_bytes(state + b"\0" * KV_BYTES_PER_TOKEN * len(held))
            return httpx.Response(200, json={"id_slot": slot, "n_saved": len(held)})
        if not path.is_file():
            return httpx.Response(400, json={"error": {"message": "failed to restore"}})
        data = path.read_bytes()
        (count,) = struct.unpack_from("<I", data, 20)
        self.slots[slot] = list(struct.unpack_from(f"<{count}i", data, 24))
        return httpx.Response(200, json={"id_slot": slot, "n_restored": count})

    def chat(self, body: dict[str, Any]) -> httpx.Response:
        self.chats.append(body)
        slot = body.get("id_slot", 0)
        prompt = self.tokens(self.template(body["messages"]))
        held = self.slots[slot]
        kept = 0
        while kept < min(len(held), len(prompt)) and held[kept] == prompt[kept]:
            kept += 1
        reply = f"noted {len(prompt)}"
        self.slots[slot] = prompt + self.tokens(reply)
        return httpx.Response(
            200,
            json={
                "id": "c",
                "object": "chat.completion",
                "created": 1,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": reply},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": 2, "total_tokens": 0},
                "timings": {"prompt_n": len(prompt) - kept, "cache_n": kept},
            },
        )


def document(topic: str, words: int = 400) -> str:
    return " ".join(f"{topic}{i}" for i in range(words))


def make_app(server: SlotServer, tmp_path: Path, **parking: Any) -> Any:
    settings = {"slots": len(server.slots), "slot_dir": server.folder, "min_prefix_tokens": 64}
    return create_proxy_app(
        "http://llama.test/v1",
        window=100_000,
        archive_dir=tmp_path / "archive",
        retry=FAST_RETRY,
        transport=server.transport(),
        slot_parking=SlotParkingConfig(**{**settings, **parking}),
    )


class Agent:
    """One session's conversation, sent whole on every turn as an agent does."""

    def __init__(self, client: httpx.AsyncClient, session: str, topic: str) -> None:
        self.client, self.session = client, session
        self.messages = [
            {"role": "system", "content": "You are a clerk."},
            {"role": "user", "content": f"Read this: {document(topic)}"},
        ]

    async def turn(self, question: str = "And then?", key: str | None = None) -> str:
        if self.messages[-1]["role"] == "assistant":
            self.messages.append({"role": "user", "content": question})
        headers = {"X-Keeper-Session": self.session}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        reply = await self.client.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": self.messages, "max_tokens": 16},
            headers=headers,
        )
        assert reply.status_code == 200, reply.text
        text = reply.json()["choices"][0]["message"]["content"]
        self.messages.append({"role": "assistant", "content": text})
        return str(text)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    slots = tmp_path / "slots"
    slots.mkdir()
    return slots


async def run(app: Any):
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p.test")
    return client


def counters(app: Any):
    return app.state.proxy.slots.counters


async def test_a_session_evicted_from_the_only_slot_is_parked_and_restored(tmp_path, folder):
    server = SlotServer(folder)
    app = make_app(server, tmp_path)
    async with await run(app) as client:
        first, second = Agent(client, "alpha", "lamp"), Agent(client, "beta", "coin")
        await first.turn()
        await second.turn()  # alpha's cache goes to disk
        assert ("save", 0) in server.actions and (folder / parked_name("default:alpha")).is_file()
        await first.turn()  # restored before alpha's request
        assert ("restore", 0) in server.actions
        last = server.chats[-1]
        assert last["id_slot"] == 0
        tally = counters(app)
        assert (tally.parks, tally.restores, sum(tally.refusals.values())) == (2, 1, 0)
        whole_window = len(server.tokens(server.template(last["messages"])))
        assert tally.tokens_spared_by_restores > whole_window // 2
        metrics = (await client.get("/metrics")).text
        assert "keeper_proxy_slot_restores_total 1.0" in metrics
        assert 'keeper_proxy_slot_refusals_total{reason="context"} 0.0' in metrics
        assert f"keeper_proxy_slot_parked_bytes {float(tally.parked_bytes)}" in metrics
    await app.state.proxy.aclose()


async def test_with_a_slot_each_sessions_keep_their_caches_and_nothing_is_parked(tmp_path, folder):
    server = SlotServer(folder, slots=2, ctx=4096)
    app = make_app(server, tmp_path)
    async with await run(app) as client:
        agents = [Agent(client, "alpha", "lamp"), Agent(client, "beta", "coin")]
        for _ in range(3):
            for agent in agents:
                await agent.turn()
        assert [a for a, _ in server.actions if a != "erase"] == []
        assert {c["id_slot"] for c in server.chats} == {0, 1}
        assert counters(app).prompt_tokens_reused > counters(app).prompt_tokens_read
    await app.state.proxy.aclose()


@pytest.mark.parametrize(
    ("change", "reason"),
    [("ctx", "context"), ("build", "build"), ("slots", "slots")],
)
async def test_a_cache_from_a_differently_started_server_is_refused_and_re_read(
    tmp_path, folder, change, reason
):
    server = SlotServer(folder)
    app = make_app(server, tmp_path)
    async with await run(app) as client:
        first, second = Agent(client, "alpha", "lamp"), Agent(client, "beta", "coin")
        await first.turn()
        await second.turn()
        if change == "ctx":
            server.ctx = 4096
        elif change == "build":
            server.build = "b2-other"
        else:
            server.slots.append([])
        answer = await first.turn()
        assert answer.startswith("noted")
        assert ("restore", 0) not in server.actions
        assert counters(app).refusals[reason] == 1 and counters(app).restores == 0
        assert not (folder / parked_name("default:alpha")).exists()
        assert server.chats[-1]["id_slot"] == 0
    await app.state.proxy.aclose()


async def test_a_cache_that_shares_too_little_with_the_request_is_not_restored(tmp_path, folder):
    server = SlotServer(folder)
    app = make_app(server, tmp_path, min_prefix_tokens=64)
    async with await run(app) as client:
        first, second = Agent(client, "alpha", "lamp"), Agent(client, "beta", "coin")
        await first.turn()
        await second.turn()
        first.messages[0]["content"] = "You are a different clerk now, with other rules."
        first.messages[1]["content"] = f"Read this instead: {document('gear')}"
        await first.turn()
        assert counters(app).refusals["prefix"] == 1
        assert ("restore", 0) not in server.actions
    await app.state.proxy.aclose()


async def test_after_a_cut_the_shared_head_is_still_restored(tmp_path, folder):
    """The window restarting from the task: the cache's head starts the request, its tail does
    not; the restore is made and the server keeps only the shared head."""
    server = SlotServer(folder)
    app = make_app(server, tmp_path)
    async with await run(app) as client:
        first, second = Agent(client, "alpha", "lamp"), Agent(client, "beta", "coin")
        await first.turn()
        await first.turn("Count the lamps.")
        await second.turn()
        first.messages[-2]["content"] = "Count the coins instead."  # the last turns differ
        first.messages.pop()
        await first.turn()
        tally = counters(app)
        assert (tally.restores, tally.partial_restores) == (1, 1)
        prompt = server.tokens(server.template(server.chats[-1]["messages"]))
        assert 0 < tally.tokens_spared_by_restores < len(prompt)
    await app.state.proxy.aclose()


async def test_parked_files_stay_within_the_disk_budget_newest_kept(tmp_path, folder):
    server = SlotServer(folder)
    one_file = 600 * (KV_BYTES_PER_TOKEN + 4)  # a window of ~420 tokens fits once, not twice
    app = make_app(server, tmp_path, disk_budget=one_file)
    async with await run(app) as client:
        agents = [Agent(client, name, name) for name in ("alpha", "beta", "gamma", "delta")]
        for agent in agents:
            await agent.turn()
        files = sorted(p.name for p in folder.glob("kv-*.bin"))
        assert files == [parked_name("default:gamma")]
        tally = counters(app)
        assert tally.pruned == 2 and tally.parked_sessions == 1
        assert tally.parked_bytes == (folder / files[0]).stat().st_size <= one_file
        await agents[0].turn()  # its file was pruned: simply read again
        assert tally.restores == 0 and sum(tally.refusals.values()) == 0
    await app.state.proxy.aclose()


async def test_a_restarted_proxy_restores_what_the_last_one_parked(tmp_path, folder):
    server = SlotServer(folder)
    app = make_app(server, tmp_path)
    async with await run(app) as client:
        first, second = Agent(client, "alpha", "lamp"), Agent(client, "beta", "coin")
        await first.turn()
        await second.turn()
    await app.state.proxy.aclose()
    again = make_app(server, tmp_path)
    server.slots[0] = []  # the server restarted too
    async with await run(again) as client:
        first.client = client
        await first.turn()
        assert counters(again).restores == 1 and counters(again).parked_sessions == 1
    await again.state.proxy.aclose()


async def test_a_file_without_its_sidecar_is_never_restored(tmp_path, folder):
    server = SlotServer(folder)
    foreign = folder / parked_name("default:alpha")
    server.slots[0] = SlotServer.tokens("<system> You are a clerk.")
    server.slot_action(0, "save", {"filename": foreign.name})
    server.slots[0] = []
    app = make_app(server, tmp_path)
    async with await run(app) as client:
        await Agent(client, "alpha", "lamp").turn()
        assert ("restore", 0) not in server.actions
    await app.state.proxy.aclose()


async def test_forgetting_a_session_erases_its_parked_file_and_its_slot(tmp_path, folder):
    server = SlotServer(folder, slots=2, ctx=4096)
    app = make_app(server, tmp_path)
    async with await run(app) as client:
        agents = [Agent(client, n, n) for n in ("alpha", "beta", "gamma")]
        for agent in agents:
            await agent.turn()
        assert (folder / parked_name("default:alpha")).is_file()
        for name in ("alpha", "gamma"):
            deleted = await client.delete(f"/keeper/sessions/{name}")
            assert deleted.status_code == 200
        assert not (folder / parked_name("default:alpha")).exists()
        assert ("erase", 0) in server.actions  # gamma held slot 0
        assert counters(app).parked_sessions == 0
    await app.state.proxy.aclose()


async def test_two_tenants_with_one_session_id_never_share_a_parked_cache(tmp_path, folder):
    server = SlotServer(folder)
    app = create_proxy_app(
        "http://llama.test/v1",
        window=100_000,
        archive_dir=tmp_path / "archive",
        retry=FAST_RETRY,
        transport=server.transport(),
        tenants=__import__("keeper_middleware.integrations.proxy", fromlist=["Tenants"]).Tenants(
            {"key-a": "acme", "key-z": "zeta"}
        ),
        slot_parking=SlotParkingConfig(slots=1, slot_dir=folder, min_prefix_tokens=64),
    )
    async with await run(app) as client:
        acme, zeta = Agent(client, "same", "lamp"), Agent(client, "same", "coin")
        await acme.turn(key="key-a")
        await zeta.turn(key="key-z")
        await acme.turn(key="key-a")
        names = {p.name for p in folder.glob("kv-*.bin")}
        assert names == {parked_name("acme:same"), parked_name("zeta:same")}
        assert counters(app).restores == 1
    await app.state.proxy.aclose()


def test_the_cli_turns_slot_parking_on_only_with_slots_and_a_folder(folder):
    parser = build_parser()
    base = ["--upstream", "http://h/v1", "--window", "8192"]
    assert slot_parking_config(parser.parse_args(base)) is None
    args = parser.parse_args(
        [*base, "--llama-slots", "2", "--slot-dir", str(folder), "--slot-disk-budget", "500M"]
    )
    config = slot_parking_config(args)
    assert (config.slots, config.disk_budget) == (2, 500 * 1024**2)
    with pytest.raises(ValueError, match="both --llama-slots"):
        slot_parking_config(parser.parse_args([*base, "--llama-slots", "2"]))
    with pytest.raises(ValueError, match="not a folder"):
        slot_parking_config(
            parser.parse_args([*base, "--llama-slots", "1", "--slot-dir", str(folder / "nope")])
        )
    assert byte_size("8G") == 8 * 1024**3 and byte_size("1500") == 1500
    assert byte_size("64KiB") == 64 * 1024
    with pytest.raises(Exception, match="not a size"):
        byte_size("lots")
