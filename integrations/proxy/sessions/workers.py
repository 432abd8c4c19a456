"""The proxy's worker threads: blocking work off the event loop, a few threads at a time.

Every keeper step and every archive write of a request runs here, never on the event loop. More
threads than a few do not make that work faster (it is Python, and takes turns at the
interpreter's lock) but make it costlier: with one thread per busy session, each request's work
hands the lock and the archive's lock from thread to thread many times over. So at most
``running`` threads take jobs at once; the others' jobs wait in the queue. A thread that waits
for something slow and outside the process (a note call to the upstream) says so
(:meth:`Workers.waiting`) and another thread takes its place meanwhile, up to ``most`` threads.

A job is handed over and its result handed back with one queue and one ``call_soon_threadsafe``,
without the futures and conditions of :class:`concurrent.futures.ThreadPoolExecutor`.
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, TypeVar

from keeper_middleware.errors import ConfigurationError

__all__ = ["Workers"]

R = TypeVar("R")
_Job = tuple[
    asyncio.AbstractEventLoop, "asyncio.Future[Any]", contextvars.Context, Callable[[], Any]
]


class Workers:
    """Threads that run blocking calls for the event loop, at most ``running`` at once.

    Args:
        running: threads that take jobs at once (more jobs wait their turn).
        most: threads in all, counting those in :meth:`waiting`.
        name: the threads' name prefix.

    Raises:
        ConfigurationError: ``running`` is below 1 or above ``most``.
    """

    def __init__(self, running: int, most: int, name: str) -> None:
        if not 1 <= running <= most:
            raise ConfigurationError(f"need 1 <= running <= most, got {running} and {most}")
        self._pool = _Pool(running, most, name)
        weakref.finalize(self, self._pool.close)

    async def run(self, call: Callable[[], R]) -> R:
        """``call()`` in a worker thread, in a copy of this task's context.

        A job still waiting when its task is cancelled does not run (as with an executor)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        self._pool.submit((loop, future, contextvars.copy_context(), call))
        return await future

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """In a worker thread, around a wait outside the process: another thread may take jobs
        meanwhile."""
        self._pool.wait_begins()
        try:
            yield
        finally:
            self._pool.wait_ends()

    def close(self) -> None:
        """Cancel the jobs not started yet and let the threads end when idle."""
        self._pool.close()


class _Pool:
    """The threads' shared state (the :class:`Workers` object is not kept alive by them)."""

    def __init__(self, running: int, most: int, name: str) -> None:
        self.running, self.most, self.name = running, most, name
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.threads = 0
        self.free = 0
        self.waiting = 0
        self.closed = False

    def _room(self) -> bool:
        """Under ``lock``: no thread is free and another may run."""
        return (
            self.free == 0
            and self.threads - self.waiting < self.running
            and self.threads < self.most
            and not self.closed
        )

    def _start(self) -> None:
        self.threads += 1
        threading.Thread(target=self._work, name=f"{self.name}_{self.threads}", daemon=True).start()

    def submit(self, job: _Job) -> None:
        self.jobs.put(job)
        with self.lock:
            if self._room():
                self._start()

    def wait_begins(self) -> None:
        with self.lock:
            self.waiting += 1
            if not self.jobs.empty() and self._room():
                self._start()

    def wait_ends(self) -> None:
        with self.lock:
            self.waiting -= 1

    def _work(self) -> None:
        while True:
            with self.lock:
                if self.closed or self.threads - self.waiting > self.running:
                    self.threads -= 1  # one too many since a wait ended
                    return
                self.free += 1
            job = self.jobs.get()
            with self.lock:
                self.free -= 1
            if job is None:
                with self.lock:
                    self.threads -= 1
                return
            _run(job)
            del job  # an idle thread keeps nothing of its last request alive

    def close(self) -> None:
        with self.lock:
            self.closed = True
            idle = self.free
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                _settle(job[0], job[1].cancel)
        for _ in range(idle):
            self.jobs.put(None)


def _run(job: _Job) -> None:
    loop, future, context, call = job
    if future.cancelled():
        return
    try:
        result = context.run(call)
    except BaseException as exc:  # handed to the awaiting task, as an executor does
        _settle(loop, _failed, future, exc)
    else:
        _settle(loop, _done, future, result)


def _settle(loop: asyncio.AbstractEventLoop, func: Callable[..., Any], *args: Any) -> None:
    with suppress(RuntimeError):  # a closed loop: no one awaits the result any more
        loop.call_soon_threadsafe(func, *args)


def _done(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _failed(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
