"""What the keeper keeps per session besides the turns: counters, the marking secret, the
search guard, the room a message has in view, and which STATE entries were moved to the archive
(one row each, read only for the words a cut's noted text holds: ``moved_rows``).

All of it lives in the archive (values per session), so a restarted keeper or another replica
on a shared store reads it back; this process only caches what it read, and drops the cache
each time it takes a session (another process may have moved the session on meanwhile).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Collection, Iterator, Mapping
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    contextmanager,
    nullcontext,
)
from typing import Any

from langchain_core.messages import BaseMessage

from keeper_middleware.archive.moved_rows import LEGACY_ENTRIES, LEGACY_KEYS, words_of
from keeper_middleware.archive.records import TIP, Chain, Head
from keeper_middleware.archive.store import ArchiveStore
from keeper_middleware.messages.facts import keeper_message
from keeper_middleware.messages.marks import SECRET_KEY, new_secret, signed
from keeper_middleware.notes.block import Notes, notes_from_json
from keeper_middleware.notes.recall import ArchivedKeys
from keeper_middleware.search.guards import GuardState
from keeper_middleware.sessions.counters import Counters
from keeper_middleware.sessions.locks import SessionLocks

GUARD_KEY = "search_guard"
"""Per-session value: the search guard's state (:class:`~keeper_middleware.search.guards.GuardState`)."""

MOVED_KEYS = LEGACY_KEYS
"""Per-session value of archives written before moved entries were rows: the moved STATE keys
(read once and moved to rows on first use)."""
MOVED_ENTRIES = LEGACY_ENTRIES
"""Per-session value of archives written before moved entries were rows: key → value as last
noted (read once and moved to rows on first use)."""


class SessionState:
    """The per-session values of one keeper, read from and written to its archive."""

    def __init__(self, archive: ArchiveStore, locks: SessionLocks) -> None:
        self.archive = archive
        self.locks = locks
        self.lock = threading.RLock()
        """Guards this process's caches (the session lock orders the sessions themselves)."""
        self.shared = locks.backend is not None
        """Whether other processes serve this archive's sessions too (then what this process
        remembers of a session is dropped each time it takes the session)."""
        self._counters: dict[str, Counters] = {}
        self._saved_counters: dict[str, dict[str, Any]] = {}
        self._secrets: dict[str, str] = {}
        self._rooms: dict[str, int] = {}
        self._later: set[str] = set()
        """Sessions whose counter writes wait for their host's own save (:meth:`saving_later`)."""
        self._guards: dict[str, tuple[GuardState, bool]] = {}
        """The search guard of each session in :meth:`saving_later`, as read or set there, and
        whether it is still to be written."""
        self._last_guards: dict[str, GuardState] = {}
        """The search guard as each session's last :meth:`saving_later` left it (written), on
        an archive no other process serves: the next one starts from it instead of reading
        it again (every write of it goes through this object, which drops or updates it)."""

    def hold(self, session: str) -> AbstractContextManager[None]:
        """Hold a session: its steps, searches and counters run one at a time, across every
        thread, task and (on a shared store) process. Re-entrant within one flow of control
        (a hold within a hold is a plain no-op: a request takes its session several times)."""
        if self.locks.held(session):
            return nullcontext()
        return self._take(session)

    @contextmanager
    def _take(self, session: str) -> Iterator[None]:
        with self.locks.hold(session) as took:
            if took:
                self._forget_counters(session)
            yield

    def ahold(self, session: str) -> AbstractAsyncContextManager[bool]:
        """:meth:`hold` for asyncio: waiting never blocks the event loop."""
        return self.locks.ahold(session, self._forget_counters)

    def _forget_counters(self, session: str) -> None:
        """Drop what this process remembers of a session: another process may have moved it on
        (on an archive no other process serves, what was read stays right)."""
        if not self.shared:
            return
        with self.lock:
            self._counters.pop(session, None)

    def drop(self, session: str) -> None:
        """Forget everything cached of a session (after it was erased from the archive)."""
        with self.lock:
            self._counters.pop(session, None)
            self._saved_counters.pop(session, None)
            self._secrets.pop(session, None)
            self._rooms.pop(session, None)
            self._guards.pop(session, None)
            self._last_guards.pop(session, None)

    def known(self, session: str) -> bool:
        """Whether a step ever ran for ``session`` here or its archive holds anything of it
        (counters are written at a thread's first step; turns at its first cut)."""
        with self.lock:
            if self._counters.get(session, Counters()) != Counters():
                return True
        stored = self.archive.get_value(session, "counters")
        return stored is not None or self.archive.turn_count(session) > 0

    def counters(self, session: str) -> Counters:
        """The session's counters (read from the archive once per hold)."""
        with self.lock:
            if session not in self._counters:
                stored = self.archive.get_value(session, "counters")
                self._counters[session] = Counters.from_json(stored)
                if stored is not None:
                    self._saved_counters[session] = self._counters[session].to_json()
            return self._counters[session]

    def save_counters(self, session: str) -> None:
        """Write the counters if they changed since they were last written (most steps change
        nothing: no cut, no rules shown, no larger window); while the session is
        :meth:`saving_later`, leave them to the host's save."""
        data = self.counters(session).to_json()
        if self._saved_counters.get(session) != data and session not in self._later:
            self.archive.put_value(session, "counters", data)
            self._saved_counters[session] = data

    @contextmanager
    def saving_later(self, session: str) -> Iterator[None]:
        """While held, the session's counters and search guard are written with its host's own
        save (:meth:`unsaved_values`, then :meth:`values_saved`), in the host's transaction,
        instead of in one of their own at each change: a proxy saves once a request. The guard
        is read once in that time, not at every use (the host holds the session, so nothing
        else changes it meanwhile), and on an archive no other process serves not even once:
        the previous time's guard is still right. Whatever is still unsaved at the end is
        written then."""
        self._later.add(session)
        try:
            yield
        finally:
            with self.lock:
                self._later.discard(session)
                guard = self._guards.pop(session, None)
                known = session in self._counters  # not when the session was erased meanwhile
            if guard is not None and guard[1]:
                self.archive.put_value(session, GUARD_KEY, guard[0].to_json())
            if guard is not None and not self.shared:
                with self.lock:  # remembered once written (a failed write reads it again)
                    self._last_guards[session] = guard[0]
            if known:
                self.save_counters(session)

    def unsaved_values(self, session: str) -> dict[str, Any]:
        """The per-session values changed since they were last written (key → value)."""
        data = self.counters(session).to_json()
        values: dict[str, Any] = {}
        if self._saved_counters.get(session) != data:
            values["counters"] = data
        with self.lock:
            guard = self._guards.get(session)
        if guard is not None and guard[1]:
            values[GUARD_KEY] = guard[0].to_json()
        return values

    def values_saved(self, session: str, values: Mapping[str, Any]) -> None:
        """Record that the host wrote ``values`` (from :meth:`unsaved_values`)."""
        if "counters" in values:
            self._saved_counters[session] = values["counters"]
        with self.lock:
            guard = self._guards.get(session)
            if guard is not None and guard[0].to_json() == values.get(GUARD_KEY):
                self._guards[session] = (guard[0], False)

    def notes(self, session: str, head: Head = TIP) -> Notes:
        """The NOTES in effect at the cut ``head`` (empty before a branch's first cut)."""
        version = self.archive.notes_at(session, head)
        if version is None:
            return _NO_NOTES
        return _notes_of(version.data_json)

    def secret(self, session: str) -> str:
        """The session's secret for marking the keeper's own messages (kept in the archive, so
        a restarted keeper still recognises them; never sent to a model)."""
        with self.lock:
            if session not in self._secrets:
                stored = self.archive.get_value(session, SECRET_KEY)
                if not isinstance(stored, str) or not stored:
                    stored = new_secret()
                    self.archive.put_value(session, SECRET_KEY, stored)
                self._secrets[session] = stored
            return self._secrets[session]

    def own(self, session: str, text: str, kind: str, msg_id: str) -> BaseMessage:
        """A keeper message, marked so that no one else's message passes for it."""
        return signed(keeper_message(text, kind, msg_id=msg_id), self.secret(session))

    def guard(self, session: str) -> GuardState:
        """The search guard's state (searches since the last new input, repeats). Read at every
        use (arms that manage their own memory reset it in the archive directly), except while
        the session is :meth:`saving_later`: then once, or not at all when the previous time
        left it and no other process serves the archive."""
        with self.lock:
            kept = None
            if session in self._later:
                kept = self._guards.get(session)
                last = self._last_guards.get(session) if kept is None else None
                if last is not None:
                    kept = self._guards[session] = (last, False)
        if kept is not None:
            return kept[0]
        guard = GuardState.from_json(self.archive.get_value(session, GUARD_KEY))
        with self.lock:
            if session in self._later:
                self._guards.setdefault(session, (guard, False))
        return guard

    def set_guard(self, session: str, guard: GuardState) -> None:
        """Write the search guard's state (with the host's save while :meth:`saving_later`)."""
        with self.lock:
            if session in self._later:
                self._guards[session] = (guard, True)
                return
            self._last_guards.pop(session, None)
        self.archive.put_value(session, GUARD_KEY, guard.to_json())

    def room(self, session: str, default: int) -> int:
        """The room one message has in view, as the last step measured it."""
        with self.lock:
            return self._rooms.get(session, default)

    def set_room(self, session: str, room: int) -> None:
        with self.lock:
            self._rooms[session] = room

    def moved_named(self, session: str, text: str, within: Chain) -> dict[str, str]:
        """The moved entries ``text`` may name (their key's first word is one of its words),
        key → value as last noted on the branch, in the order they moved (``recall.named_in``
        decides)."""
        return dict(self.archive.moved_named(session, words_of(text), within=within))

    def archived_keys(self, session: str, names: Collection[str], within: Chain) -> ArchivedKeys:
        """Whether a case-folded name is a moved key's on the branch, the ``names`` read at
        once."""
        return ArchivedKeys(
            lambda folded: self.archive.moved_among(session, folded, within=within),
            prefetch=names,
        )


_NOTES_KEPT = 64
_read_notes: OrderedDict[str, Notes] = OrderedDict()
_read_notes_lock = threading.Lock()


_NO_NOTES = Notes()
"""The NOTES before a branch's first cut (a value: one serves every session)."""


def _notes_of(data_json: str) -> Notes:
    """The notes a stored version holds, read once: every step reads the latest version, and
    reading thousands of entries again each time made a step's cost grow with the NOTES."""
    with _read_notes_lock:
        found = _read_notes.get(data_json)
        if found is not None:
            _read_notes.move_to_end(data_json)
            return found
    notes = notes_from_json(data_json)
    remember_notes(data_json, notes)
    return notes


def remember_notes(data_json: str, notes: Notes) -> None:
    """Remember that the stored version ``data_json`` holds ``notes`` (``notes_to_json(notes)``
    wrote it): the step after a cut reads the version the cut wrote, and parsing its hundreds
    of entries back cost more than the rest of that step's reading."""
    if not _as_read(notes):
        return  # reading it back would give tuples where these notes hold other sequences
    with _read_notes_lock:
        _read_notes[data_json] = notes
        _read_notes.move_to_end(data_json)
        while len(_read_notes) > _NOTES_KEPT:
            _read_notes.popitem(last=False)


def _as_read(notes: Notes) -> bool:
    """Whether ``notes`` holds its entries as ``notes_from_json`` gives them (tuples)."""
    held = (notes.rules, notes.open, notes.recency, notes.state)
    return all(type(part) is tuple for part in held) and all(
        type(pair) is tuple for pair in notes.state
    )
