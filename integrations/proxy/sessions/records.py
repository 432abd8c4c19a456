"""What the proxy keeps per session besides the keeper's archive and NOTES, and where it keeps it.

A session's record (its live window, the keeper's bookkeeping, one fingerprint per agent message
taken in) and its counters live behind :class:`SessionStore`, one small interface: the default
:class:`ArchiveSessionStore` keeps them as per-session values in the keeper's own archive, so one
file (or one database) holds everything and a restarted proxy continues every session. Another
backend implements the same methods.

Saving is the proxy's main per-request cost, so a save writes the record and the counters in one
transaction (:meth:`SessionStore.save_all`), and each window message is turned into its stored
form once while it stays in the window, not on every save.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from langchain_core.messages import BaseMessage, message_to_dict, messages_from_dict

from keeper_middleware.archive.store import ArchiveStore, put_values
from keeper_middleware.errors import MalformedDataError
from keeper_middleware.integrations.proxy.sessions.metrics import ProxyStats
from keeper_middleware.sessions.locks import SessionLockBackend

__all__ = [
    "RECORD_KEY",
    "STATS_KEY",
    "WINDOW_CHUNK",
    "ArchiveSessionStore",
    "MessageMemo",
    "SessionRecord",
    "SessionStore",
    "StoredRecord",
]

RECORD_KEY = "proxy_session"
STATS_KEY = "proxy_counters"
_RECORD_VERSION = 3
TAKEN_CHUNK = 128
"""Fingerprints per stored chunk: a save rewrites only the chunks that changed."""
WINDOW_CHUNK = 16
"""Window messages per stored chunk: a save rewrites only the chunks that changed."""
STATE_CHUNK = 256
"""Entries per stored chunk of the keeper state's per-message parts (``seen``, ``items``)."""
_STATE_PARTS = ("seen", "items")
"""The keeper state's parts that hold one entry per message in view (the ids taken in, in the
order they were taken in, and each one's item number): stored in chunks, not in the head."""


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """What the proxy keeps per session besides the keeper's archive and notes."""

    window: tuple[BaseMessage, ...] = ()
    """The live window: exactly what the upstream is sent after the system prompt."""
    keeper_state: Mapping[str, Any] = field(default_factory=dict)
    """The keeper's JSON-like bookkeeping (``StepResult.state``)."""
    taken: tuple[tuple[str, str], ...] = ()
    """(fingerprint, message id) of every agent message taken in, in the agent's order."""
    withdrawn: tuple[tuple[str, str], ...] = ()
    """(fingerprint, message id) of agent messages withdrawn, kept so that the same message
    sent again gets its first id back (and is never archived twice)."""

    def to_json(
        self, as_dict: Callable[[BaseMessage], dict[str, Any]] = message_to_dict
    ) -> dict[str, Any]:
        """The stored form; ``as_dict`` turns one message into its stored form (a
        :class:`MessageMemo` may stand in for ``message_to_dict``)."""
        return {
            "version": _RECORD_VERSION,
            "window": [as_dict(m) for m in self.window],
            "keeper_state": dict(self.keeper_state),
            "taken": [list(pair) for pair in self.taken],
            "withdrawn": [list(pair) for pair in self.withdrawn],
        }

    @classmethod
    def from_json(cls, data: object) -> SessionRecord:
        if not isinstance(data, dict):
            return cls()
        return cls(
            window=tuple(messages_from_dict(data.get("window") or [])),
            keeper_state=dict(data.get("keeper_state") or {}),
            taken=tuple((str(d), str(i)) for d, i in data.get("taken") or []),
            withdrawn=tuple((str(d), str(i)) for d, i in data.get("withdrawn") or []),
        )

    def appended(self, messages: Sequence[BaseMessage]) -> SessionRecord:
        return replace(self, window=(*self.window, *messages))


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """A session record as the archive holds it: a head under ``RECORD_KEY`` (the keeper's state
    and the names of the chunks), the window in chunks of ``WINDOW_CHUNK`` messages and the
    fingerprints in chunks of ``TAKEN_CHUNK``, each chunk under a key of its own.

    The keeper state's per-message parts (``seen`` and ``items``) are stored in chunks of
    ``STATE_CHUNK`` the same way, the head keeping only their place in the state.

    These lists only grow between cuts, so a save writes the head and only the chunks that
    changed (usually the last of each): what a request costs to save stays the same however
    long the window and the conversation are. Changed chunks get new keys (a new
    ``generation``) and the head, written last, names the chunks it uses: a save cut short
    leaves the previous head and its chunks intact.
    """

    record: SessionRecord
    chunk_keys: tuple[str, ...] = ()
    generation: int = 0
    window_keys: tuple[str, ...] = ()
    state_keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """The chunks of each of the keeper state's per-message parts, by part."""
    state_lists: Mapping[str, list[Any]] = field(default_factory=dict)
    """Those parts as the chunks hold them, so the next save compares with them as they are."""

    @classmethod
    def load(cls, head: object, read: Callable[[str], object]) -> StoredRecord:
        """From the head value and a reader of other keys; a head that holds its fingerprints
        or its window inline (the earlier formats) is read as it is."""
        record = SessionRecord.from_json(head)
        if not isinstance(head, dict) or not isinstance(head.get("taken_chunks"), list):
            return cls(record)
        keys = tuple(str(k) for k in head["taken_chunks"])
        taken = [(str(d), str(i)) for key in keys for d, i in _chunk(read, key)]
        count = int(head.get("taken_count", len(taken)))
        record = replace(record, taken=tuple(taken[:count]))
        window_keys: tuple[str, ...] = ()
        if isinstance(head.get("window_chunks"), list):
            window_keys = tuple(str(k) for k in head["window_chunks"])
            dicts = [m for key in window_keys for m in _chunk(read, key)]
            record = replace(record, window=tuple(messages_from_dict(dicts)))
        state_keys: dict[str, tuple[str, ...]] = {}
        chunked = head.get("state_chunks")
        if isinstance(chunked, dict):
            state = dict(record.keeper_state)
            for name, names in chunked.items():
                state_keys[name] = tuple(str(k) for k in names)
                values = [v for key in state_keys[name] for v in _chunk(read, key)]
                state[name] = dict(values) if name == "items" else values
            record = replace(record, keeper_state=state)
        return cls(record, keys, int(head["generation"]), window_keys, state_keys)

    def saved(
        self,
        record: SessionRecord,
        as_dict: Callable[[BaseMessage], dict[str, Any]] = message_to_dict,
    ) -> tuple[StoredRecord, dict[str, Any], list[str]]:
        """(the stored form of ``record``, the values to write in order with the head last, the
        keys no longer used, to clear after the head is written)."""
        generation = self.generation + 1
        writes: dict[str, Any] = {}
        keys = _chunked(
            self.record.taken,
            self.chunk_keys,
            record.taken,
            TAKEN_CHUNK,
            f"{RECORD_KEY}.taken",
            generation,
            writes,
            lambda part: [list(pair) for pair in part],
            lambda old, new: old == new,
        )
        window_keys = _chunked(
            self.record.window,
            self.window_keys,
            record.window,
            WINDOW_CHUNK,
            f"{RECORD_KEY}.window",
            generation,
            writes,
            lambda part: [as_dict(m) for m in part],
            # messages are never changed in place: the same objects are the same messages
            lambda old, new: len(old) == len(new) and all(map(operator.is_, old, new)),
        )
        state, state_keys, lists = self._state_chunks(record.keeper_state, generation, writes)
        head = {
            **replace(record, taken=(), window=(), keeper_state=state).to_json(as_dict),
            "version": _RECORD_VERSION,
            "taken_chunks": keys,
            "taken_count": len(record.taken),
            "window_chunks": window_keys,
            "state_chunks": state_keys,
            "generation": generation,
        }
        writes[RECORD_KEY] = head
        used = {*keys, *window_keys, *(k for part in state_keys.values() for k in part)}
        before = (
            *self.chunk_keys,
            *self.window_keys,
            *(k for p in self.state_keys.values() for k in p),
        )
        stale = [k for k in before if k not in used]
        kept = {name: tuple(part) for name, part in state_keys.items()}
        saved = StoredRecord(record, tuple(keys), generation, tuple(window_keys), kept, lists)
        return saved, writes, stale

    def _state_chunks(
        self, keeper_state: Mapping[str, Any], generation: int, writes: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, list[str]], dict[str, list[Any]]]:
        """The keeper state as the head holds it (each per-message part's value left as None,
        keeping its place) and the keys of each part's chunks (changed chunks added to
        ``writes``), and each part as a list. A part of another shape than the keeper's stays in
        the head whole."""
        state = dict(keeper_state)
        keys: dict[str, list[str]] = {}
        lists: dict[str, list[Any]] = {}
        for name in _STATE_PARTS:
            after = _entries_of(name, state.get(name))
            if after is None:
                continue
            before = self.state_lists.get(name)
            if before is None:
                before = _entries_of(name, self.record.keeper_state.get(name)) or []
            lists[name] = after
            keys[name] = _chunked(
                before,
                self.state_keys.get(name, ()),
                after,
                STATE_CHUNK,
                f"{RECORD_KEY}.{name}",
                generation,
                writes,
                list if name == "seen" else lambda part: [list(pair) for pair in part],
                operator.eq,
            )
            state[name] = None
        return state, keys, lists


def _entries_of(name: str, value: object) -> list[Any] | None:
    """A per-message part of the keeper state as a list to store in chunks: the ids taken in,
    or the (id, item) pairs; None when it has another shape."""
    if name == "items":
        return list(value.items()) if isinstance(value, dict) else None
    return value if isinstance(value, list) else None


def _chunk(read: Callable[[str], object], key: str) -> list[Any]:
    chunk = read(key)
    if not isinstance(chunk, list):
        raise MalformedDataError(
            f"the archive has no {key!r}, a part of this session's record; restore the "
            "archive file from a backup, or delete the session to start it again"
        )
    return chunk


def _chunked(
    before: Sequence[Any],
    before_keys: Sequence[str],
    after: Sequence[Any],
    size: int,
    prefix: str,
    generation: int,
    writes: dict[str, Any],
    stored: Callable[[Sequence[Any]], list[Any]],
    same: Callable[[Sequence[Any], Sequence[Any]], bool],
) -> list[str]:
    """The keys of ``after`` cut in chunks of ``size``: a chunk equal to the one stored at the
    same place keeps its key, any other is added to ``writes`` under a new key."""
    keys: list[str] = []
    for number, start in enumerate(range(0, len(after), size)):
        part = after[start : start + size]
        if number < len(before_keys) and same(before[start : start + size], part):
            keys.append(before_keys[number])
            continue
        key = f"{prefix}.{number}.{generation}"
        writes[key] = stored(part)
        keys.append(key)
    return keys


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

    def __call__(self, message: BaseMessage) -> dict[str, Any]:
        known = self._known.get(id(message))
        if known is None or known[0] is not message:
            known = (message, self.convert(message))
            self._known[id(message)] = known
        return known[1]

    def keep(self, messages: Sequence[BaseMessage]) -> None:
        """Drop the conversions of messages no longer in ``messages`` once the memo holds more
        than there are (so what it holds stays within the window's size, and a window that only
        grows is not walked on every save)."""
        if len(self._known) <= len(messages):
            return
        live = set(map(id, messages))
        if not self._known.keys() <= live:
            self._known = {k: v for k, v in self._known.items() if k in live}


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
        stored, writes, stale = self._stored(session).saved(record, dicts)
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
