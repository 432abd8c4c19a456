"""Phase spans: the keeper says when each part of its work starts and ends, for tracing and timing.

A step spends its time in a few phases (reading and planning, the note request and the model's
reply to it, the cut's archive transaction, queueing the archived turns for the index), and a
search in one more. Knowing which one a slow step spent its time in is what tracing is for, and
what the benchmark's notes-cost clock measures. A listener hears every span:

    class Printer:
        def phase_started(self, phase: str, session: str) -> None:
            print("start", phase, session)

        def phase_ended(self, phase: str, session: str, error: BaseException | None) -> None:
            print("end", phase, session, error)

    keeper = Keeper(config, phase_listener=Printer())   # this keeper's spans
    with listening(Printer()):                            # every keeper's, while the block runs
        ...

Spans nest (``note_call`` inside ``note_request`` inside ``step``; ``index_sync`` inside
``commit``) and always end, with the error that ended them if one did. A listener that raises is
logged and skipped: tracing never breaks a step. With no listener a span costs one check.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from types import TracebackType
from typing import Protocol, runtime_checkable

log = logging.getLogger(__name__)

PHASES = (
    "step",
    "prepare",
    "note_request",
    "note_call",
    "commit",
    "index_sync",
    "search",
)
"""The phases a listener hears, each with what it spans:

- ``step``: a whole :meth:`Keeper.step` / ``astep`` (the other step phases run inside it);
- ``prepare``: reading the new messages, sizing them and planning the cut (every step);
- ``note_request``: building the note request and running the note-taking conversation (each cut);
- ``note_call``: one model call of that conversation, inside ``note_request``: the model's time;
- ``commit``: the cut's archive transaction, fitting and writing the NOTES (each cut);
- ``index_sync``: handing the newly archived turns to the search index (inside ``commit``);
- ``search``: one archive search tool call.
"""


@runtime_checkable
class PhaseListener(Protocol):
    """What hears the keeper's phase spans (see ``PHASES``)."""

    def phase_started(self, phase: str, session: str) -> None:
        """``phase`` of ``session`` starts."""

    def phase_ended(self, phase: str, session: str, error: BaseException | None) -> None:
        """``phase`` of ``session`` ends; ``error`` is what ended it, if it raised."""


_lock = threading.Lock()
_listeners: tuple[PhaseListener, ...] = ()
_NO_SPAN: AbstractContextManager[None] = nullcontext()


@contextmanager
def listening(listener: PhaseListener) -> Iterator[PhaseListener]:
    """Let ``listener`` hear every keeper's spans in this process while the block runs.

    Args:
        listener: a :class:`PhaseListener`.

    Raises:
        ArgumentTypeError: ``listener`` lacks ``phase_started`` or ``phase_ended``.
    """
    global _listeners
    _check(listener)
    with _lock:
        _listeners = (*_listeners, listener)
    try:
        yield listener
    finally:
        with _lock:
            remaining = list(_listeners)
            remaining.remove(listener)
            _listeners = tuple(remaining)


def _check(listener: object) -> None:
    if not isinstance(listener, PhaseListener):
        from keeper_middleware.errors import ArgumentTypeError

        raise ArgumentTypeError(
            f"phase_listener={listener!r} has no phase_started(phase, session) and "
            "phase_ended(phase, session, error) methods; give an object that has both "
            "(keeper_middleware.phases.PhaseListener)"
        )


def checked_listener(listener: PhaseListener | None) -> PhaseListener | None:
    """``listener`` if it is one (or None).

    Raises:
        ArgumentTypeError: ``listener`` lacks ``phase_started`` or ``phase_ended``.
    """
    if listener is not None:
        _check(listener)
    return listener


def listened() -> bool:
    """Whether a process-wide listener is listening (see :func:`listening`)."""
    return bool(_listeners)


def span(own: PhaseListener | None, phase: str, session: str) -> AbstractContextManager[None]:
    """The span of ``phase`` for ``own`` (a keeper's listener) and every process-wide one."""
    if own is None and not _listeners:
        return _NO_SPAN
    heard = _listeners if own is None else (own, *_listeners)
    return _Span(heard, phase, session)


class _Span:
    __slots__ = ("_listeners", "_phase", "_session")

    def __init__(self, listeners: tuple[PhaseListener, ...], phase: str, session: str) -> None:
        self._listeners = listeners
        self._phase = phase
        self._session = session

    def __enter__(self) -> None:
        for listener in self._listeners:
            try:
                listener.phase_started(self._phase, self._session)
            except Exception:
                log.exception("phase listener %r failed at the start of %s", listener, self._phase)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for listener in reversed(self._listeners):
            try:
                listener.phase_ended(self._phase, self._session, error)
            except Exception:
                log.exception("phase listener %r failed at the end of %s", listener, self._phase)
