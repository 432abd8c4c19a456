"""The proxy's worker threads: a few at a time, another one while one waits for the upstream,
results and errors handed back to the awaiting task, in its context."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time

import pytest

from keeper_middleware.errors import ConfigurationError
from keeper_middleware.integrations.proxy.sessions.workers import Workers

_ASKED: contextvars.ContextVar[str] = contextvars.ContextVar("asked", default="nobody")


@pytest.mark.anyio
async def test_at_most_running_threads_take_jobs_at_once() -> None:
    workers = Workers(2, 32, "test-workers")
    lock, now, most = threading.Lock(), [0], [0]

    def job() -> str:
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        time.sleep(0.01)
        with lock:
            now[0] -= 1
        return threading.current_thread().name

    names = await asyncio.gather(*(workers.run(job) for _ in range(8)))
    assert most[0] <= 2
    assert threading.current_thread().name not in names
    assert all(name.startswith("test-workers_") for name in names)
    workers.close()


@pytest.mark.anyio
async def test_a_thread_waiting_outside_the_process_makes_room_for_another() -> None:
    workers = Workers(1, 2, "test-workers")
    released = threading.Event()

    def waits_for_the_other() -> bool:
        with workers.waiting():  # as a note call waits for the upstream
            return released.wait(timeout=10)

    first = asyncio.ensure_future(workers.run(waits_for_the_other))
    await asyncio.sleep(0)
    await workers.run(released.set)  # with one thread only, this would wait for the first
    assert await first is True
    workers.close()


@pytest.mark.anyio
async def test_errors_and_the_tasks_context_reach_the_worker_and_come_back() -> None:
    workers = Workers(2, 4, "test-workers")

    def fails() -> None:
        raise ValueError("from the worker")

    with pytest.raises(ValueError, match="from the worker"):
        await workers.run(fails)
    _ASKED.set("this task")
    assert await workers.run(_ASKED.get) == "this task"
    workers.close()


@pytest.mark.anyio
async def test_closing_cancels_the_jobs_not_started() -> None:
    workers = Workers(1, 1, "test-workers")
    started, release = threading.Event(), threading.Event()

    def blocks() -> None:
        started.set()
        release.wait(timeout=10)

    first = asyncio.ensure_future(workers.run(blocks))
    queued = asyncio.ensure_future(workers.run(lambda: "ran"))
    await asyncio.to_thread(started.wait, 10)
    workers.close()
    release.set()
    await first
    with pytest.raises(asyncio.CancelledError):
        await queued


def test_running_must_fit_within_most() -> None:
    with pytest.raises(ConfigurationError, match="running <= most"):
        Workers(4, 2, "test-workers")
    with pytest.raises(ConfigurationError):
        Workers(0, 2, "test-workers")
