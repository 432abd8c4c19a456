"""The async paths never block the event loop: every archive and index read or write runs in a
worker thread. Checked under ``blockbuster`` (the blocking-call detector ``langgraph dev`` uses)
for the async agent, the middleware and the proxy, each through several cuts and searches."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from blockbuster import blockbuster_ctx
from langchain_core.messages import HumanMessage

from keeper_middleware import Keeper
from tests.test_integrations_parity import (
    CONFIG,
    THREAD,
    middleware_agent,
    react_agent,
    scenario,
    scripted_model,
    thread,
)
from tests.test_keeper_calls_hidden import keeper_agent

pytestmark = pytest.mark.filterwarnings("ignore:create_react_agent has been moved")

TURNS = 30


def run_async(agent: Any, texts: list[str]) -> None:
    async def drive() -> None:
        with blockbuster_ctx():
            for text in texts:
                await agent.ainvoke({"messages": [HumanMessage(text)]}, thread())

    asyncio.run(drive())


@pytest.mark.parametrize("archive", ["file", ":memory:"])
@pytest.mark.parametrize(
    "build", [keeper_agent, middleware_agent, react_agent], ids=["agent", "middleware", "hook"]
)
def test_the_async_agent_never_blocks_the_loop(build, archive, tmp_path):
    where = tmp_path / "archive.sqlite3" if archive == "file" else ":memory:"
    keeper = Keeper(CONFIG, archive=where)
    run_async(build(scripted_model(), keeper), list(scenario(TURNS)))
    counters = keeper.counters(THREAD)
    assert counters.cuts >= 2 and counters.searches >= 1


def test_the_proxy_never_blocks_the_loop(tmp_path: Path):
    from tests.proxy_upstream import ScriptedUpstream, chat, client_for, convo, make_app

    upstream = ScriptedUpstream()
    app = make_app(upstream, tmp_path, window=4096)
    turns = [
        f"Item {i}. The clerk recorded r{i} at {i * 37}. " + "Quiet day. " * 40
        for i in range(1, 25)
    ]

    async def drive() -> None:
        with blockbuster_ctx():
            async with client_for(app) as client:
                history: list[str] = []
                for text in turns:
                    history.append(text)
                    response = await client.post(
                        "/v1/chat/completions",
                        json=chat(convo(*history), stream=len(history) % 2 == 0),
                        headers={"X-Keeper-Session": "blocking"},
                    )
                    assert response.status_code == 200, response.text
                    reply = response.text if len(history) % 2 == 0 else response.json()
                    history.append("ok" if reply else "")
            await app.state.proxy.aclose()

    asyncio.run(drive())
    assert upstream.note_calls  # the proxy cut and took notes on the loop's behalf
