"""What the proxy keeps per session besides the keeper's archive and NOTES, and where it keeps it.

A session's record (its live window, the keeper's bookkeeping, one fingerprint per agent message
taken in) and its counters live behind :class:`SessionStore`, one small interface: the default
:class:`ArchiveSessionStore` keeps them as per-session values in the keeper's own archive, so one
file (or one database) holds everything and a restarted proxy continues every session. Another
backend implements the same methods.

Saving is the proxy's main per-request cost, so a save writes the record and the counters in one
transaction (:meth:`SessionStore.save_all`), and each window message is turned into its stored
form once while it stays in the window, not on every save.
The record itself and the form it is stored in (a head and lists in chunks) are
:mod:`.stored_record`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from operator import is_, itemgetter
from typing import Any, Protocol, cast

from langchain_core.messages import BaseMessage, message_to_dict

from keeper_middleware.archive.json_text import takes_json_text, value_text
from keeper_middleware.archive.store import ArchiveStore, put_values
from keeper_middleware.integrations.proxy.sessions.metrics import ProxyStats
from keeper_middleware.integrations.proxy.sessions.stored_record import (
    RECORD_KEY,
    STATE_CHUNK,
    TAKEN_CHUNK,
    WINDOW_CHUNK,
    SessionRecord,
    StoredList,
    StoredRecord,
    record_keys,
)
from keeper_middleware.sessions.locks import SessionLockBackend

STATS_KEY = "proxy_counters"
_MESSAGE: Callable[[tuple[BaseMessage, str]], BaseMessage] = itemgetter(0)
_TEXT: Callable[[tuple[BaseMessage, str]], str] = itemgetter(1)

__all__ = [
    "RECORD_KEY",
    "STATE_CHUNK",
    "STATS_KEY",
    "TAKEN_CHUNK",
    "WINDOW_CHUNK",
    "ArchiveSessionStore",
    "MessageMemo",
    "SessionRecord",
    "SessionStore",
    "StoredList",
    "StoredRecord",
    "record_keys",
]


class SessionStore(Protocol):
    """Where the proxy keeps each session's record and counters.

    Calls for one session never overlap (the proxy runs one request per session at a time);
    calls for different sessions may come from different threads."""

    def load(self, session: str) -> SessionRecord: ...

    def save(self, session: str, record: SessionRecord) -> None:
        """Replace the session's record; a save cut short leaves the previous one readable."""
        ...

    def stats(self, session: str) -> ProxyStats:
        """The session's counters (a live object the proxy updates, then :meth:`save_stats`)."""
        ...

    def save_stats(self, session: str, stats: ProxyStats) -> None: ...

    def save_all(self, session: str, record: SessionRecord, stats: ProxyStats) -> None:
        """:meth:`save` and :meth:`save_stats` together, in one transaction where the backend
        has transactions (the proxy saves both once per request)."""
        ...

    def forget(self, session: str) -> None:
        """Drop the session's record and counters from memory and storage."""
        ...

    def refresh(self, session: str) -> None:
        """Called when a request takes the session: forget what is remembered of it if another
        process (a replica on the same database) may have changed it since."""
        ...


class MessageMemo:
    """One conversion of each window message (to its stored form, to what the upstream reads),
    made once while the message stays in use instead of on every request.

    Messages are never changed in place (the keeper and the proxy make changed copies), so the
    message object itself is the key; the memo holds the message, so its ``id()`` is not reused
    while the entry lives, and :meth:`keep` drops every message no longer in use. The converted
    values are shared: callers only read them."""

    def __init__(self, convert: Callable[[BaseMessage], dict[str, Any]]) -> None:
        self.convert = convert
        self._known: dict[int, tuple[BaseMessage, dict[str, Any]]] = {}
        self._texts: dict[int, tuple[BaseMessage, str]] = {}

    def __call__(self, message: BaseMessage) -> dict[str, Any]:
        known = self._known.get(id(message))
        if known is None or known[0] is not message:
            known = (message, self.convert(message))
            self._known[id(message)] = known
        return known[1]

    def text(self, message: BaseMessage) -> str:
        """The JSON text of the message's converted form, as a store writes it (made once).

        Raises:
            TypeError: the converted form is not JSON-able.
            ValueError: it holds a NaN or infinite float.
        """
        known = self._texts.get(id(message))
        if known is None or known[0] is not message:
            known = (message, value_text(self(message)))
            self._texts[id(message)] = known
        return known[1]

    def texts(self, messages: Sequence[BaseMessage]) -> list[str]:
        """``[self.text(m) for m in messages]``: the texts already made are read at C speed (a
        save writes the window's newest messages, most of them written by an earlier save).

        Raises:
            TypeError: a converted form is not JSON-able.
            ValueError: it holds a NaN or infinite float.
        """
        found = list(map(self._texts.get, map(id, messages)))
        if None not in found:
            made = cast("list[tuple[BaseMessage, str]]", found)
            if all(map(is_, map(_MESSAGE, made), messages)):
                return list(map(_TEXT, made))
        return [
            known[1] if known is not None and known[0] is m else self.text(m)
            for known, m in zip(found, messages, strict=True)
        ]

    def keep(self, messages: Sequence[BaseMessage]) -> None:
        """Drop the conversions of messages no longer in ``messages`` once the memo holds more
        than there are (so what it holds stays within the window's size, and a window that only
        grows is not walked on every save)."""
        if len(self._known) <= len(messages) and len(self._texts) <= len(messages):
            return
        live = set(map(id, messages))
        if not self._known.keys() <= live:
            self._known = {k: v for k, v in self._known.items() if k in live}
        if not self._texts.keys() <= live:
            self._texts = {k: v for k, v in self._texts.items() if k in live}


class ArchiveSessionStore:
    """Records and counters as per-session values in the keeper's archive (the default).

    On an archive shared between processes (PostgreSQL) a request first reads the record's
    head again: when its generation is the one remembered, the remembered fingerprints are
    still right (saves of one session never overlap); otherwise the record is read whole.
    Counters are always read again there.
    """

    def __init__(
        self,
        archive: ArchiveStore,
        *,
        also: Callable[[str], dict[str, Any]] | None = None,
        saved_also: Callable[[str, Mapping[str, Any]], None] | None = None,
    ) -> None:
        """``also`` gives other values of a session to write in the same transaction as each
        save (the keeper's counters), ``saved_also`` is told once they are written."""
        self.archive = archive
        self.also = also
        self.saved_also = saved_also
        self.shared = isinstance(archive, SessionLockBackend)
        self.texts = takes_json_text(archive)
        """Whether the archive takes values as their JSON text (window messages are then
        encoded once while in view, not at every save that writes them)."""
        self._records: dict[str, StoredRecord] = {}
        self._stats: dict[str, ProxyStats] = {}
        self._dicts: dict[str, MessageMemo] = {}

    def refresh(self, session: str) -> None:
        if not self.shared:
            return  # this process is the only writer
        self._stats.pop(session, None)
        known = self._records.get(session)
        if known is None:
            return
        head = self.archive.get_value(session, RECORD_KEY)
        generation = head.get("generation") if isinstance(head, dict) else None
        if generation != known.generation or head is None:
            self._records.pop(session, None)

    def _stored(self, session: str) -> StoredRecord:
        if session not in self._records:
            archive = self.archive
            self._records[session] = StoredRecord.load(
                archive.get_value(session, RECORD_KEY), lambda key: archive.get_value(session, key)
            )
        return self._records[session]

    def load(self, session: str) -> SessionRecord:
        return self._stored(session).record

    def _record_values(
        self, session: str, record: SessionRecord
    ) -> tuple[StoredRecord, dict[str, Any]]:
        """``record``'s stored form and the values that store it, in order: the changed
        fingerprint chunks, the head, then the chunks no longer used (cleared)."""
        dicts = self._dicts.setdefault(session, MessageMemo(message_to_dict))
        before = self._stored(session)
        try:
            # each window message encoded once while in view, where the archive takes texts
            as_text, as_texts = (dicts.text, dicts.texts) if self.texts else (None, None)
            stored, writes, stale = before.saved(record, dicts, as_text, as_texts)
        except (TypeError, ValueError):  # not JSON-able: the archive refuses it, naming the key
            stored, writes, stale = before.saved(record, dicts)
        dicts.keep(record.window)
        return stored, {**writes, **dict.fromkeys(stale)}

    def _put(self, session: str, values: dict[str, Any]) -> None:
        extra = self.also(session) if self.also is not None else {}
        put_values(self.archive, session, {**extra, **values})
        if extra and self.saved_also is not None:
            self.saved_also(session, extra)

    def save(self, session: str, record: SessionRecord) -> None:
        stored, values = self._record_values(session, record)
        self._put(session, values)
        self._records[session] = stored

    def stats(self, session: str) -> ProxyStats:
        if session not in self._stats:
            self._stats[session] = ProxyStats.from_json(self.archive.get_value(session, STATS_KEY))
        return self._stats[session]

    def save_stats(self, session: str, stats: ProxyStats) -> None:
        self._stats[session] = stats
        self._put(session, {STATS_KEY: stats.to_json()})

    def save_all(self, session: str, record: SessionRecord, stats: ProxyStats) -> None:
        stored, values = self._record_values(session, record)
        values[STATS_KEY] = stats.to_json()
        self._put(session, values)
        self._records[session] = stored
        self._stats[session] = stats

    def forget(self, session: str) -> None:
        self._records.pop(session, None)
        self._stats.pop(session, None)
        self._dicts.pop(session, None)
