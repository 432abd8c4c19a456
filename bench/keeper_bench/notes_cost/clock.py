"""The keeper's CPU in a notes-cost run, and where it goes: each second in exactly one phase.

A growth in the keeper's CPU along a stream says little until it is known which part of the work
grows: the note requests' checks, the archive transaction, the index, the searches. Timing them
in a scratch script each time a figure moved was slow and could not be rerun by anyone else, so
the clock that measures the keeper's CPU splits it too.

Each phase is timed exclusively: a phase entered inside another (indexing inside the commit of a
cut, the model's own reply inside the note request) is taken out of the outer one's time. The
reader's model calls are a phase of their own that is not the keeper's: the keeper's CPU is the
sum of the keeper's phases, the same figure as the time inside ``Keeper.step``/``astep``/
``search``/``run_search_tool`` less the model calls made from inside them.

The clock hears the keeper's phase spans (``keeper_middleware.phases``: the public hook users'
tracing hears too) for as long as it is installed, and maps them to its phases (``SPANS``): the
model call inside a note request is the model's, not the keeper's.

The phases are timed one at a time on a shared stack, which is right for the benchmark's runs
(one session, steps one after the other; ``astep``'s worker threads run while it waits for
them). It is not meant for concurrent sessions.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

MODEL = "model"
"""The reader's own replies: timed only to be taken out of the keeper's phases."""

PHASES = ("prepare", "note request", "commit", "indexing", "search", "rest", "gc")
"""The keeper's phases, in the order a step meets them; "gc" is Python's garbage collector
when it ran inside one of the others."""

PHASE_MEANINGS = {
    "prepare": "reading the new messages, sizing them and planning the cut (every step)",
    "note request": "building the note request, reading and checking the reply (each cut)",
    "commit": "the cut's archive transaction, fitting and writing the NOTES (each cut)",
    "indexing": "adding the archived turns to the search index (each cut)",
    "search": "the archive search tool (each search)",
    "rest": "the rest of a step (finishing a step without a cut, bookkeeping)",
    "gc": (
        "Python's garbage collector, run while the keeper worked (a full collection walks "
        "every object of the process, most of them imported modules, and lands in whichever "
        "tenth the allocations reach its threshold: the same tenths in every run)"
    ),
}


SPANS = {
    "step": "rest",
    "prepare": "prepare",
    "note_request": "note request",
    "note_call": MODEL,
    "commit": "commit",
    "index_sync": "indexing",
    "search": "search",
}
"""Each of the keeper's spans (``keeper_middleware.phases.PHASES``) and the clock's phase it is
timed in."""


class KeeperClock:
    """CPU seconds spent in the keeper, by phase, less the model calls it makes.

    ``clock`` is the CPU clock read (process time by default); a test may give its own.
    """

    def __init__(self, clock: Callable[[], float] = time.process_time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._stack: list[list[Any]] = []  # [phase, started, time of the phases inside it]
        self._collecting_since: float | None = None
        self.phases: dict[str, float] = dict.fromkeys((*PHASES, MODEL), 0.0)

    @property
    def keeper(self) -> float:
        """The keeper's CPU so far: every phase but the model's."""
        return sum(seconds for phase, seconds in self.phases.items() if phase != MODEL)

    def keeper_phases(self) -> dict[str, float]:
        """The keeper's CPU so far in each of its phases."""
        return {phase: self.phases[phase] for phase in PHASES}

    def _enter(self, phase: str) -> None:
        # the entry is made before the clock is read: a collection its allocation sets off
        # belongs to the phase around, not to this one as well
        entry: list[Any] = [phase, 0.0, 0.0]
        with self._lock:
            entry[1] = self._clock()
            self._stack.append(entry)

    def _leave(self) -> None:
        with self._lock:
            phase, started, inside = self._stack.pop()
            spent = self._clock() - started
            self.phases[phase] += spent - inside
            if self._stack:
                self._stack[-1][2] += spent

    def collector_event(self, event: str, _info: dict[str, Any]) -> None:
        """A ``gc.callbacks`` hook: a collection inside a keeper phase is timed as "gc" and
        taken out of that phase (inside the model's reply, or outside the keeper, it is not the
        keeper's)."""
        if event == "start":
            self._collecting_since = self._clock()
            return
        started, self._collecting_since = self._collecting_since, None
        if started is None:
            return
        # no lock: the collector runs inside whatever allocated, the stack's own updates too
        if not self._stack or self._stack[-1][0] == MODEL:
            return
        spent = self._clock() - started
        self.phases["gc"] += spent
        self._stack[-1][2] += spent

    def timed(self, phase: str, method: Callable[..., Any]) -> Callable[..., Any]:
        """``method`` with its CPU counted to ``phase`` (and not to the phase it runs in)."""

        @functools.wraps(method)
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._enter(phase)
            try:
                return method(*args, **kwargs)
            finally:
                self._leave()

        return timed

    def timed_async(self, phase: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        async def timed(*args: Any, **kwargs: Any) -> Any:
            self._enter(phase)
            try:
                return await method(*args, **kwargs)
            finally:
                self._leave()

        return timed

    def phase_started(self, phase: str, session: str) -> None:
        """A ``PhaseListener``: the keeper's span ``phase`` starts."""
        self._enter(SPANS.get(phase, "rest"))

    def phase_ended(self, phase: str, session: str, error: BaseException | None) -> None:
        """A ``PhaseListener``: the span ends (raised or not, its time counts)."""
        self._leave()

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Times every keeper of the process while the block runs: the clock listens to
        their phase spans, and to the garbage collector."""
        from keeper_middleware.phases import listening

        gc.callbacks.append(self.collector_event)
        try:
            with listening(self):
                yield
        finally:
            gc.callbacks.remove(self.collector_event)
