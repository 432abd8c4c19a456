"""Handles: opaque names a store hands out, each standing for a session and a small value.

A front end that gives clients a name to come back with (the proxy's Responses ids) must not
put what the name stands for in it: a session's name can carry what a user typed. It keeps the
name as a handle instead: a random string, looked up in the archive, so the lookup survives a
restart and every replica on one database finds it. A handle belongs to its session and is
erased with it (``delete_session``).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["HandleStore"]


@runtime_checkable
class HandleStore(Protocol):
    """A store that keeps handles (both archive backends do)."""

    def put_handle(self, session: str, handle: str, value: Any) -> None:
        """Record ``handle`` as standing for ``session`` and the JSON-able ``value``.

        Raises:
            ArchiveError: the handle is already taken (handles are never reused).
            ArgumentTypeError: ``value`` is not JSON-able.
        """
        ...

    def find_handle(self, handle: str) -> tuple[str, Any] | None:
        """(the session, the value) ``handle`` stands for; None for a handle never given or
        whose session was deleted."""
        ...
