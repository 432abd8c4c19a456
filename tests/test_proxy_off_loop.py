"""The proxy's event loop only moves bytes: every keeper step and every write to the archive of a
chat request runs in a worker thread, cuts and note calls included, so one session's SQLite
commit or long window never holds up the other sessions' requests."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from tests.proxy_upstream import ScriptedUpstream, client_for, make_app, run_items


def _recording(calls: list[tuple[str, int]], name: str, func: Callable[..., Any]) -> Any:
    def recorded(*args: Any, **kwargs: Any) -> Any:
        calls.append((name, threading.get_ident()))
        return func(*args, **kwargs)

    return recorded


@pytest.mark.anyio
async def test_steps_and_archive_writes_never_run_on_the_event_loop(tmp_path) -> None:
    upstream = ScriptedUpstream(notes_reply=lambda body: "NO CHANGES")
    app = make_app(upstream, tmp_path, window=2048)
    proxy = app.state.proxy
    keeper, archive = proxy.keeper, proxy.keeper.archive
    calls: list[tuple[str, int]] = []
    keeper.step = _recording(calls, "step", keeper.step)
    for name in ("put_values", "put_value", "commit_cut"):
        if hasattr(archive, name):
            setattr(archive, name, _recording(calls, name, getattr(archive, name)))
    loop_thread = threading.get_ident()
    async with client_for(app) as client:
        await run_items(client, 16, "loop")
    assert keeper.counters("default:loop").cuts >= 1  # the cuts' writes are among them
    names = {name for name, _ in calls}
    assert {"step", "put_values"} <= names
    on_loop = [name for name, thread in calls if thread == loop_thread]
    assert on_loop == []
    await proxy.aclose()
