"""What the keeper proxy keeps between calls, apart from the request it is parsing.

Kept apart from ``cost.py``'s process measurements because it measures another way: the
proxy in this process behind a mock upstream, its Python heap traced with ``tracemalloc``, where
the other rows read a separate process's resident memory from ``/proc``.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from keeper_bench.proxy.servers import (
    BODY_LIMIT,
    instant_completion,
    instant_reply,
)
from keeper_bench.steps import SYSTEM_PROMPT


async def _heap_by_history(
    turns: Sequence[Sequence[str]], window: int, archive: Path, every: int
) -> list[tuple[int, float, float]]:
    import gc
    import tracemalloc

    from keeper_middleware.integrations.proxy import create_proxy_app

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, json=instant_completion(instant_reply(json.loads(request.content)))
        )

    app = create_proxy_app(
        "http://upstream.invalid/v1",
        window=window,
        archive_dir=archive,
        max_body_bytes=BODY_LIMIT,
        transport=httpx.MockTransport(answer),
    )
    history: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}]
    sent = [[{"role": "user", "content": text} for text in turn] for turn in turns]
    points: list[tuple[int, float, float]] = []
    chars, next_sample = 0, every
    headers = {"x-keeper-session": "heap", "content-type": "application/json"}
    transport = httpx.ASGITransport(app=app)
    tracemalloc.start()
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
            for turn in sent:
                history += turn
                chars += sum(len(message["content"]) for message in turn)
                body = json.dumps({"model": "instant", "messages": history})
                response = await client.post("/v1/chat/completions", content=body, headers=headers)
                reply = response.json()["choices"][0]["message"]["content"]
                history.append({"role": "assistant", "content": reply})
                if chars // 4 >= next_sample:
                    del body, response
                    gc.collect()
                    kept, peak = tracemalloc.get_traced_memory()
                    points.append((chars // 4, kept / 1e6, peak / 1e6))
                    next_sample += every
    finally:
        tracemalloc.stop()
        await app.state.proxy.aclose()
    return points


def heap_by_history(
    turns: Sequence[Sequence[str]], *, window: int, archive: Path, every: int
) -> list[tuple[int, float, float]]:
    """(history tokens, Python heap the proxy keeps between calls in MB, peak heap in MB).

    In-process with ``tracemalloc``, started after the agent's messages are built, so only its
    replies and its list of messages are counted besides the proxy: this separates what the
    proxy keeps from what a request costs while it is parsed, which resident memory cannot.
    """
    shutil.rmtree(archive, ignore_errors=True)
    return asyncio.run(_heap_by_history(turns, window, archive, every))
