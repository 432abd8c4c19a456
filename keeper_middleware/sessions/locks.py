"""One session, one step at a time: across threads, tasks and (with a shared store) processes.

Two workers or two proxy replicas that receive requests of the same session must not both cut
it. Within a process a session is marked busy; a store shared between processes (PostgreSQL)
also implements ``SessionLockBackend``, a non-blocking try-lock held by the server, so a holder
that dies releases it with its connection. Waiting polls with a growing pause, which is the same
code for threads and for asyncio tasks (no thread parked per waiter, no connection per waiter).

Holding is re-entrant along one flow of control (a ``ContextVar``): a proxy that holds a session
for a whole request can call the keeper's step, which asks for the same session, without
deadlocking; threads started with a copy of the context (``asyncio.to_thread``) count as the
same flow.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from contextvars import ContextVar, Token
from typing import Protocol, runtime_checkable

from keeper_middleware.errors import ArchiveError, ConfigurationError

__all__ = ["SessionLockBackend", "SessionLocks"]

_HELD: ContextVar[frozenset[tuple[int, str]]] = ContextVar(
    "keeper_held_sessions", default=frozenset()
)
_FIRST_PAUSE = 0.002
_LONGEST_PAUSE = 0.1


@runtime_checkable
class SessionLockBackend(Protocol):
    """A lock per session that other processes see (a store shared between processes)."""

    def try_lock_session(self, session: str) -> bool:
        """Take the session's lock if no other process holds it; never waits."""
        ...

    def unlock_session(self, session: str) -> None: ...


class SessionLocks:
    """Per-session mutual exclusion; ``timeout`` seconds of waiting raise ``ArchiveError``."""

    def __init__(self, backend: SessionLockBackend | None = None, *, timeout: float = 900.0):
        if timeout <= 0:
            raise ConfigurationError(f"timeout must be positive seconds, got {timeout!r}")
        self.backend = backend
        self.timeout = timeout
        self._mutex = threading.Lock()
        self._busy: set[str] = set()

    def held(self, session: str) -> bool:
        """Whether this flow of control already holds the session."""
        return (id(self), session) in _HELD.get()

    @contextmanager
    def hold(self, session: str) -> Iterator[bool]:
        """Hold the session; yields True when this call took it, False when already held."""
        if self.held(session):
            yield False
            return
        deadline = time.monotonic() + self.timeout
        pause = _FIRST_PAUSE
        while not self._try_take(session):
            pause = self._wait_or_fail(session, deadline, pause)
            time.sleep(pause)
        token = _HELD.set(_HELD.get() | {(id(self), session)})
        try:
            yield True
        finally:
            _HELD.reset(token)
            self._give_back(session)

    def ahold(
        self, session: str, taken: Callable[[str], None] | None = None
    ) -> AbstractAsyncContextManager[bool]:
        """``hold`` for asyncio: waiting never blocks the event loop. Entering gives True when
        this call took the session, False when already held; ``taken(session)`` is called
        when it took it (before the body runs)."""
        return _AsyncHold(self, session, taken)

    def _wait_or_fail(self, session: str, deadline: float, pause: float) -> float:
        if time.monotonic() >= deadline:
            raise ArchiveError(
                f"session {session!r} stayed busy for {self.timeout:g} s (another request, worker "
                "or replica is working on it); retry later, or raise the lock timeout"
            )
        return min(pause * 2, _LONGEST_PAUSE)

    def _try_take(self, session: str) -> bool:
        with self._mutex:
            if session in self._busy:
                return False
            self._busy.add(session)
        try:
            taken = self.backend is None or self.backend.try_lock_session(session)
        except BaseException:
            self._release_local(session)
            raise
        if not taken:
            self._release_local(session)
        return taken

    async def _atry_take(self, session: str) -> bool:
        if self.backend is None:
            return self._try_take(session)
        attempt = asyncio.ensure_future(asyncio.to_thread(self._try_take, session))
        try:
            return await asyncio.shield(attempt)
        except asyncio.CancelledError:
            # the waiter is gone; a lock the thread still takes must not stay held
            attempt.add_done_callback(lambda done: self._release_if_taken(session, done))
            raise

    def _release_if_taken(self, session: str, done: asyncio.Future[bool]) -> None:
        if not done.cancelled() and done.exception() is None and done.result():
            self._give_back(session)

    def _give_back(self, session: str) -> None:
        try:
            if self.backend is not None:
                self.backend.unlock_session(session)
        finally:
            self._release_local(session)

    def _release_local(self, session: str) -> None:
        with self._mutex:
            self._busy.discard(session)


class _AsyncHold(AbstractAsyncContextManager[bool]):
    """:meth:`SessionLocks.ahold`: a plain object rather than an ``asynccontextmanager``
    generator, whose machinery costs more than the hold itself (every proxy request takes its
    session once)."""

    __slots__ = ("_locks", "_session", "_taken", "_token")

    def __init__(
        self, locks: SessionLocks, session: str, taken: Callable[[str], None] | None
    ) -> None:
        self._locks, self._session, self._taken = locks, session, taken
        self._token: Token[frozenset[tuple[int, str]]] | None = None

    async def __aenter__(self) -> bool:
        locks, session = self._locks, self._session
        if locks.held(session):
            return False
        deadline = time.monotonic() + locks.timeout
        pause = _FIRST_PAUSE
        while not await locks._atry_take(session):
            pause = locks._wait_or_fail(session, deadline, pause)
            await asyncio.sleep(pause)
        self._token = _HELD.set(_HELD.get() | {(id(locks), session)})
        if self._taken is not None:
            try:
                self._taken(session)
            except BaseException:
                await self.__aexit__()
                raise
        return True

    async def __aexit__(self, *exc_info: object) -> None:
        token, self._token = self._token, None
        if token is None:  # it was held already: nothing taken here
            return
        _HELD.reset(token)
        if self._locks.backend is None:
            self._locks._give_back(self._session)
        else:
            await asyncio.to_thread(self._locks._give_back, self._session)
