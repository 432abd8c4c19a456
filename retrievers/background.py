"""One thread per process that does indexing work off the caller's path.

Embedding a cut's passages costs tens of milliseconds of CPU a message
(bench/results/locomo_recall.md); done inside the step that makes the cut, it is time the agent
waits for. Instead the work is handed to one worker thread that every keeper and every index of
the process share (more threads would only fight over two cores), and the step returns.

- **Jobs are named**: submitting a job under a name already queued does nothing more, since a
  job reads what is left to do when it runs (a session's unindexed turns, a retriever's queue).
  The queue is therefore bounded by the number of names, and it is bounded in count too
  (``MAX_QUEUED``): past it a submitter waits for room, or (on the worker itself) runs the job.
- **A caller that needs a job's result now does not wait behind the others**:
  :meth:`BackgroundWorker.run_now` takes a queued job out and runs it in the caller's thread,
  or waits for it when the worker is already running it.
- **Searches go first**: a search runs inside :meth:`BackgroundWorker.foreground`, and the
  worker's jobs call :meth:`BackgroundWorker.yield_to_foreground` between their batches, so the
  worker pauses while a search runs instead of competing with it for the two cores and the
  interpreter (measured: a hybrid search right after a cut took 1.3-4.7 s beside the cut's
  embedding, bench/results/index_cost.md). A pause lasts ``MAX_PAUSE`` at most, so searches
  one after the other cannot hold indexing back for good.
- **Nothing is started at import**: the thread starts with the first job. It is drained when the
  interpreter exits (queued jobs run before it ends), and owners drain their own jobs when
  closed. A job that raises is logged; its owner keeps the failure (indexes record progress only
  after their writes, so nothing is lost: the work is done again next time).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Hashable, Iterator

from keeper_middleware.errors import ConfigurationError

log = logging.getLogger(__name__)

MAX_QUEUED = 1_024
"""Most jobs waiting at once; a submitter past it waits for room."""
MAX_PAUSE = 2.0
"""Longest the worker pauses for searches at one of its batches (seconds)."""

Job = Callable[[], None]


class BackgroundWorker:
    """Named jobs run one at a time by one daemon thread (see the module docstring)."""

    def __init__(self, *, max_queued: int = MAX_QUEUED, name: str = "keeper-indexer") -> None:
        if max_queued < 1:
            raise ConfigurationError(f"max_queued must be a positive int, got {max_queued}.")
        self._max_queued = max_queued
        self._name = name
        self._queued: dict[Hashable, Job] = {}
        self._running: Hashable | None = None
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._exit_hook = False
        self._foreground = 0
        self._quiet = threading.Condition()
        self._depth = threading.local()
        """How deep the calling thread is in ``foreground`` (a thread that waits for the worker
        stops counting as foreground meanwhile)."""

    # ----------------------------------------------------------------- for owners

    def submit(self, key: Hashable, job: Job) -> None:
        """Run ``job`` in the background, unless a job under ``key`` is already waiting."""
        inline = False
        with self._changed:
            if key in self._queued:
                return
            while len(self._queued) >= self._max_queued and not self.on_worker():
                self._changed.wait()
            if len(self._queued) >= self._max_queued or self._stopping:
                inline = True  # the worker itself, with no room; or the process is exiting
            else:
                self._queued[key] = job
                self._start()
                self._changed.notify_all()
        if inline:
            job()

    def run_now(self, key: Hashable) -> None:
        """Make sure the job under ``key`` has run: a queued one runs here and now, a running one
        is waited for; nothing queued or running returns at once."""
        job: Job | None = None
        with self._changed:
            job = self._queued.pop(key, None)
            if job is None:
                while self._running == key and not self.on_worker():
                    self._changed.wait()
                return
            self._changed.notify_all()  # room in the queue
        job()

    def drain(self) -> None:
        """Wait until nothing is queued or running (on the worker itself: run what is queued)."""
        while True:
            with self._changed:
                if self.on_worker():
                    if not self._queued:
                        return
                    key = next(iter(self._queued))
                    job = self._queued.pop(key)
                else:
                    if not self._queued and self._running is None:
                        return
                    if self._thread is None or not self._thread.is_alive():
                        key = next(iter(self._queued))
                        job = self._queued.pop(key)
                    else:
                        self._changed.wait()
                        continue
            job()

    @contextlib.contextmanager
    def foreground(self) -> Iterator[None]:
        """Work that someone is waiting for (a search): the worker pauses at its next batch
        until it ends (see the module docstring). Nests; any thread."""
        self._depth.n = getattr(self._depth, "n", 0) + 1
        self._count_foreground(+1)
        try:
            yield
        finally:
            self._depth.n -= 1
            self._count_foreground(-1)

    @contextlib.contextmanager
    def waiting_for_worker(self) -> Iterator[None]:
        """Foreground work that waits for the worker (a lock its batch holds, a job it runs):
        the worker does not pause for this thread meanwhile, or the two would wait for each
        other until the pause ran out."""
        depth = getattr(self._depth, "n", 0)
        if not depth:
            yield
            return
        self._depth.n = 0
        self._count_foreground(-depth)
        try:
            yield
        finally:
            self._depth.n = depth
            self._count_foreground(depth)

    def yield_to_foreground(self, longest: float | None = None) -> None:
        """Called by a job between two batches: on the worker, wait while foreground work runs
        (``longest`` seconds at most, default ``MAX_PAUSE``); anywhere else (a search writing
        its own session's vectors, which is the foreground) return at once."""
        if not self.on_worker():
            return
        with self._quiet:
            self._quiet.wait_for(
                lambda: not self._foreground, timeout=MAX_PAUSE if longest is None else longest
            )

    def _count_foreground(self, change: int) -> None:
        with self._quiet:
            self._foreground += change
            if not self._foreground:
                self._quiet.notify_all()

    def on_worker(self) -> bool:
        """Whether the caller is the worker thread (its jobs must not wait for themselves)."""
        return self._thread is not None and threading.current_thread() is self._thread

    @property
    def pending(self) -> int:
        """Jobs queued or running now."""
        with self._changed:
            return len(self._queued) + (self._running is not None)

    # ----------------------------------------------------------------- the thread

    def _start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
        self._thread.start()
        if not self._exit_hook:
            atexit.register(self._at_exit)
            self._exit_hook = True

    def _work(self) -> None:
        while True:
            with self._changed:
                while not self._queued:
                    if self._stopping:
                        return
                    self._changed.wait()
                key = next(iter(self._queued))
                job = self._queued.pop(key)
                self._running = key
                self._changed.notify_all()
            try:
                job()
            except BaseException:  # the owner keeps the failure; the thread goes on
                log.exception("background indexing job %r failed", key)
            finally:
                with self._changed:
                    self._running = None
                    self._changed.notify_all()

    def _at_exit(self) -> None:
        """Run what is queued before the interpreter ends (the thread is a daemon)."""
        started = time.monotonic()
        waiting = self.pending
        if waiting:
            log.info("draining %d background indexing job(s) before exit", waiting)
        self.drain()
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        if waiting:
            log.info("background indexing drained in %.2f s", time.monotonic() - started)


_worker: BackgroundWorker | None = None
_worker_lock = threading.Lock()


def background_worker() -> BackgroundWorker:
    """The process's worker, made on first use (never at import)."""
    global _worker
    with _worker_lock:
        if _worker is None:
            _worker = BackgroundWorker()
        return _worker


def _forget_in_child() -> None:
    """A forked child has no worker thread: it makes its own on first use."""
    global _worker, _worker_lock
    _worker = None
    _worker_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
