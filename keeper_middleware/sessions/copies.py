"""Threads copied from another thread's state: which archive session each goes on in.

``update_state({"configurable": {"thread_id": "t2"}}, get_state(t1).values)`` copies a thread.
The archive keeps memory per session (a thread's id), so ``t2`` had none, and its first step was
refused as if the archive had been replaced. A keeper state names its archive session
(:data:`~keeper_middleware.sessions.branches.ARCHIVE_SESSION_KEY`), so a copy goes on in the
session it came from, as a branch of its own from the cut its state names (as a fork does), and
the thread it came from never sees it. A state from before states named their session, or a copy
that left the keeper's private channel out, is traced by the cut its state, or the NOTES in its
view, name.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langchain_core.messages import BaseMessage

from keeper_middleware.archive.store import ArchiveStore
from keeper_middleware.messages.facts import keeper_kind
from keeper_middleware.messages.marks import is_genuine
from keeper_middleware.sessions.branches import ARCHIVE_SESSION_KEY, HEAD_KEY, notes_cut_in_view

log = logging.getLogger(__name__)


class ThreadCopies:
    """The archive session of each thread a keeper has seen copied (in memory: a copy's own
    state names it again after its first step)."""

    def __init__(self, archive: ArchiveStore, secret: Callable[[str], str]) -> None:
        self.archive = archive
        self.secret = secret
        self._copied: dict[str, str] = {}
        self._untraced: set[tuple[str, str]] = set()
        """(thread, cut) pairs no session of the archive holds (looked for once a process)."""

    def of(self, session: str) -> str:
        """The archive session of a thread seen copied; the thread's own otherwise."""
        return self._copied.get(session, session)

    def archived_as(
        self, session: str, state: Mapping[str, Any] | None, messages: Sequence[BaseMessage]
    ) -> str:
        """The archive session a thread's keeper state belongs to: its own, or the session of
        the thread it was copied from."""
        state = state if isinstance(state, Mapping) else {}
        named = state.get(ARCHIVE_SESSION_KEY)
        origin = named if isinstance(named, str) and named else None
        if origin is None and session not in self._copied:
            origin = self._traced(session, state, messages)
        if origin is None:
            return self.of(session)
        if origin != session and self._copied.get(session) != origin:
            log.info("thread %s goes on from a copy of thread %s's state", session, origin)
            self._copied[session] = origin
        return origin

    def _traced(
        self, session: str, state: Mapping[str, Any], messages: Sequence[BaseMessage]
    ) -> str | None:
        """The session that holds the cut a state (or, without one, its NOTES in view) names,
        when the thread's own does not. The NOTES message must be the keeper's own for that
        session, marked with its secret: a forged or pasted one never leads into another
        session's memory."""
        if HEAD_KEY in state:
            head, shown = state.get(HEAD_KEY), None
        else:
            shown = next((m for m in messages if keeper_kind(m) == "notes"), None)
            head = notes_cut_in_view(messages)
        if not isinstance(head, str) or (session, head) in self._untraced:
            return None
        if self.archive.find_cut(session, head) is not None:
            return None
        for other in self.archive.sessions():
            if other == session or self.archive.find_cut(other, head) is None:
                continue
            if shown is None or is_genuine(shown, self.secret(other)):
                return other
        self._untraced.add((session, head))
        return None
