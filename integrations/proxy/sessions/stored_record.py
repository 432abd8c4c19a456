"""A proxy session's record, and the form it is stored in: a head and lists in chunks (pure).

The record is the live window, the keeper's bookkeeping and one fingerprint per agent message
taken in. Its lists only grow between cuts, so they are stored in chunks under keys of their
own (:class:`~keeper_middleware.archive.chunked_lists.StoredList`) and a save writes what is new
and the head: what a request costs to save stays the same however long the conversation is.
Where the values go is :mod:`.records`' (:class:`~.records.SessionStore`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from langchain_core.messages import BaseMessage, message_to_dict, messages_from_dict

from keeper_middleware.archive.chunked_lists import StoredList, store_list
from keeper_middleware.archive.json_text import dict_text, list_text, value_text
from keeper_middleware.errors import MalformedDataError

__all__ = [
    "RECORD_KEY",
    "STATE_CHUNK",
    "TAKEN_CHUNK",
    "WINDOW_CHUNK",
    "SessionRecord",
    "StoredList",
    "StoredRecord",
    "record_keys",
]

RECORD_KEY = "proxy_session"
_RECORD_VERSION = 4
TAKEN_CHUNK = 128
"""Fingerprints per stored chunk: a save rewrites only the chunks that changed."""
WINDOW_CHUNK = 16
"""Window messages per stored chunk: a save rewrites only the chunks that changed."""
STATE_CHUNK = 256
"""Entries per stored chunk of the keeper state's per-message parts (``seen``, ``items``: the
ids taken in, in the order they were taken in, and each one's item number)."""


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


_SIZES = {"taken": TAKEN_CHUNK, "window": WINDOW_CHUNK, "seen": STATE_CHUNK, "items": STATE_CHUNK}
"""The lists stored in chunks, and the entries in each one's full chunks."""
_UNSAVED = {name: StoredList(size) for name, size in _SIZES.items()}
"""Each list as it stands before its first save (immutable: shared by every record)."""


def _pieces_key(generation: int) -> str:
    """The key of the pieces a save wrote, of every list: {list's name: its piece's entries}
    (one value, so a request's save writes three rows: that, the head and the counters)."""
    return f"{RECORD_KEY}.pieces.{generation}"


def record_keys(head: Mapping[str, Any]) -> set[str]:
    """The keys of every value a stored head (version 4) names."""
    lists = {name: StoredList.from_json(data) for name, data in head["lists"].items()}
    return {
        *(k for name, saved in lists.items() for k in saved.keys(f"{RECORD_KEY}.{name}")),
        *(_pieces_key(made) for saved in lists.values() for _, made in saved.pieces),
    }


def _columns(name: str, record: SessionRecord) -> tuple[Sequence[Any], ...] | None:
    """A list of ``record`` as the columns compared from save to save; None when the keeper
    state's part has another shape than the keeper's (it then stays in the head whole)."""
    if name == "taken":
        return (record.taken,)
    if name == "window":
        return (record.window,)
    value = record.keeper_state.get(name)
    if name == "items":
        return (list(value), list(value.values())) if isinstance(value, dict) else None
    return (list(value),) if isinstance(value, list) else None


class _Texts(list[str]):
    """Window entries as their JSON texts (:meth:`MessageMemo.text`), joined into the stored
    value's text once the save's values are known (:func:`_as_texts`)."""


def _stored_form(
    name: str,
    columns: tuple[Sequence[Any], ...],
    as_dict: Callable[[BaseMessage], Any],
    as_text: Callable[[BaseMessage], str] | None = None,
    as_texts: Callable[[Sequence[BaseMessage]], list[str]] | None = None,
) -> Callable[[int, int], list[Any]]:
    """How entries ``start:end`` of a list are stored (the form of every version so far)."""
    first = columns[0]
    if name == "window":
        if as_texts is not None:
            return lambda start, end: _Texts(as_texts(first[start:end]))
        if as_text is not None:
            return lambda start, end: _Texts(map(as_text, first[start:end]))
        return lambda start, end: [as_dict(m) for m in first[start:end]]
    if name == "items":
        second = columns[1]
        return lambda start, end: [
            [k, v] for k, v in zip(first[start:end], second[start:end], strict=True)
        ]
    if name == "taken":
        return lambda start, end: [list(pair) for pair in first[start:end]]
    return lambda start, end: list(first[start:end])


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """A session record as the archive holds it: a head under ``RECORD_KEY`` (the keeper's
    state, the withdrawn fingerprints and where each list's chunks are) and the lists in
    chunks, each chunk under a key of its own (:class:`StoredList`): the window, the
    fingerprints taken in and the keeper state's per-message parts (``seen``, ``items``).

    These lists only grow between cuts, so a save writes the new entries and the head (nothing
    at all when nothing changed): what a request costs to save stays the same however long
    the window and the conversation are. Chunks written get new keys (a new ``generation``)
    and the head, written after them, names the chunks it uses; the chunks it no longer uses
    are cleared after it: a save cut short leaves the previous head and its chunks intact.
    """

    record: SessionRecord
    generation: int = 0
    lists: Mapping[str, StoredList] = field(default_factory=dict)
    head: Mapping[str, Any] | None = None
    """The head as last saved (without its generation): a save that changes nothing in it and
    in the lists writes nothing."""
    legacy: tuple[str, ...] = ()
    """Keys of chunks of an earlier form, cleared by the next save."""

    @classmethod
    def load(cls, head: object, read: Callable[[str], object]) -> StoredRecord:
        """From the head value and a reader of other keys; a head of an earlier form (lists
        inline, version 2, or chunks named one by one, version 3) is read as it is."""
        record = SessionRecord.from_json(head)
        if not isinstance(head, dict):
            return cls(record)
        if isinstance(head.get("lists"), dict):
            return cls._load_lists(record, head, read)
        if not isinstance(head.get("taken_chunks"), list):
            return cls(record)
        keys = tuple(str(k) for k in head["taken_chunks"])
        taken = [(str(d), str(i)) for key in keys for d, i in _chunk(read, key)]
        count = int(head.get("taken_count", len(taken)))
        record = replace(record, taken=tuple(taken[:count]))
        legacy = [*keys]
        if isinstance(head.get("window_chunks"), list):
            window_keys = [str(k) for k in head["window_chunks"]]
            legacy += window_keys
            dicts = [m for key in window_keys for m in _chunk(read, key)]
            record = replace(record, window=tuple(messages_from_dict(dicts)))
        chunked = head.get("state_chunks")
        if isinstance(chunked, dict):
            state = dict(record.keeper_state)
            for name, names in chunked.items():
                legacy += [str(k) for k in names]
                values = [v for key in names for v in _chunk(read, str(key))]
                state[name] = dict(values) if name == "items" else values
            record = replace(record, keeper_state=state)
        return cls(record, int(head["generation"]), legacy=tuple(legacy))

    @classmethod
    def _load_lists(
        cls, record: SessionRecord, head: dict[str, Any], read: Callable[[str], object]
    ) -> StoredRecord:
        lists: dict[str, StoredList] = {}
        pieces: dict[int, object] = {}
        state = dict(record.keeper_state)
        for name, chunks in head["lists"].items():
            if name not in _SIZES:
                raise MalformedDataError(f"this session's record names an unknown list {name!r}")
            saved = StoredList.from_json(chunks)
            entries = [v for key in saved.keys(f"{RECORD_KEY}.{name}") for v in _chunk(read, key)]
            for _, made in saved.pieces:
                if made not in pieces:
                    pieces[made] = read(_pieces_key(made))
                entries += _chunk(partial(_piece, pieces[made], name), _pieces_key(made))
            if len(entries) != saved.length:
                raise MalformedDataError(
                    f"this session's record holds {len(entries)} entries of {name!r} where its "
                    f"head names {saved.length}; restore the archive file from a backup, or "
                    "delete the session to start it again"
                )
            if name == "taken":
                record = replace(record, taken=tuple((str(d), str(i)) for d, i in entries))
            elif name == "window":
                record = replace(record, window=tuple(messages_from_dict(entries)))
            else:
                state[name] = dict(entries) if name == "items" else entries
            lists[name] = saved
        record = replace(record, keeper_state=state)
        lists = {
            name: replace(saved, columns=_columns(name, record) or ())
            for name, saved in lists.items()
        }
        body = {k: v for k, v in head.items() if k != "generation"}
        return cls(record, int(head["generation"]), lists, body)

    def saved(
        self,
        record: SessionRecord,
        as_dict: Callable[[BaseMessage], dict[str, Any]] = message_to_dict,
        as_text: Callable[[BaseMessage], str] | None = None,
        as_texts: Callable[[Sequence[BaseMessage]], list[str]] | None = None,
    ) -> tuple[StoredRecord, dict[str, Any], list[str]]:
        """(the stored form of ``record``, the values to write in order with the head last, the
        keys no longer used, to clear after the head is written). With ``as_text`` (the JSON
        text of ``as_dict``'s form of a message) the values holding window messages are given
        as their text (:class:`~keeper_middleware.archive.json_text.JSONText`), joined from
        the messages' texts: the same text, each message encoded once (``as_texts``: the texts
        of several messages at once, the same as ``as_text`` gives one by one)."""
        generation = self.generation + 1
        writes: dict[str, Any] = {}
        lists: dict[str, StoredList] = {}
        stale = [*self.legacy]
        state = dict(record.keeper_state)
        for name in _SIZES:
            columns = _columns(name, record)
            if columns is None:
                continue
            stored = _stored_form(name, columns, as_dict, as_text, as_texts)
            before = self.lists.get(name) or _UNSAVED[name]
            prefix = f"{RECORD_KEY}.{name}"
            lists[name], retired, piece = store_list(
                prefix, before, columns, generation, writes, stored
            )
            stale += retired
            if piece is not None:
                writes.setdefault(_pieces_key(generation), {})[name] = piece
            if name in state:
                state[name] = None  # keeps its place in the state
        if not self.lists.keys() <= lists.keys():
            stale += (
                k
                for n, saved in self.lists.items()
                if n not in lists
                for k in saved.keys(f"{RECORD_KEY}.{n}")
            )
        used = {made for saved in lists.values() for _, made in saved.pieces}
        held = {made for saved in self.lists.values() for _, made in saved.pieces}
        stale += (_pieces_key(made) for made in sorted(held - used))
        head = {  # ``SessionRecord.to_json`` of the record without its lists, and where they are
            "version": _RECORD_VERSION,
            "window": [],
            "keeper_state": state,
            "taken": [],
            "withdrawn": list(map(list, record.withdrawn)),
            "lists": {name: saved.to_json() for name, saved in lists.items()},
        }
        if not writes and not stale and head == self.head:
            return replace(self, record=record, lists=lists), {}, []
        if as_text is not None:
            writes = {key: _as_texts(value) for key, value in writes.items()}
        writes[RECORD_KEY] = {**head, "generation": generation}
        return StoredRecord(record, generation, lists, head), writes, stale


def _as_texts(value: Any) -> Any:
    """A value to write with its window entries' texts joined: a window chunk as its text, the
    pieces' value as its text when it holds the window's piece (others stay as they are)."""
    if type(value) is _Texts:
        return list_text(value)
    if type(value) is dict and any(type(v) is _Texts for v in value.values()):
        return dict_text(
            {k: list_text(v) if type(v) is _Texts else value_text(v) for k, v in value.items()}
        )
    return value


def _piece(pieces: object, name: str, key: str) -> object:
    """A list's piece in the value holding a save's pieces."""
    return pieces.get(name) if isinstance(pieces, dict) else None


def _chunk(read: Callable[[str], object], key: str) -> list[Any]:
    chunk = read(key)
    if not isinstance(chunk, list):
        raise MalformedDataError(
            f"the archive has no {key!r}, a part of this session's record; restore the "
            "archive file from a backup, or delete the session to start it again"
        )
    return chunk
