"""The keeper state's per-message parts (the ids taken in and their item numbers) are saved as a
change: a request that appends messages writes only the new entries and a small head, a
record saved in an earlier form still loads, and a save cut short at any write leaves the
previous record or the new one whole, never a mix (no turn lost or counted twice)."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, message_to_dict

from keeper_middleware.archive.sqlite.archive import SQLiteArchive
from keeper_middleware.errors import KeeperError
from keeper_middleware.integrations.proxy.sessions.records import (
    RECORD_KEY,
    STATE_CHUNK,
    ArchiveSessionStore,
    SessionRecord,
    StoredRecord,
    record_keys,
)

_MESSAGES: tuple[BaseMessage, ...] = tuple(
    (HumanMessage if n % 2 == 0 else AIMessage)(content=f"line {n}", id=f"m{n}")
    for n in range(3 * STATE_CHUNK + 4)
)
"""The window's messages: the same objects from save to save, as the proxy keeps them."""


def _record(count: int) -> SessionRecord:
    """A session after ``count`` messages taken in, nothing cut."""
    window = _MESSAGES[:count]
    ids = [f"m{n}" for n in range(count)]
    return SessionRecord(
        window=window,
        keeper_state={
            "seen": ids,
            "items": {i: n // 2 for n, i in enumerate(ids)},
            "items_since_notes": count // 2,
            "room": 900,
        },
        taken=tuple((f"d{n}", f"m{n}") for n in range(count)),
    )


def _load(values: dict[str, Any]) -> SessionRecord:
    return StoredRecord.load(values[RECORD_KEY], values.get).record


def test_a_save_after_an_append_writes_only_the_new_entries() -> None:
    first, writes, _ = StoredRecord(SessionRecord()).saved(_record(2 * STATE_CHUNK + 10))
    values = dict(writes)
    _, writes, stale = first.saved(_record(2 * STATE_CHUNK + 12))
    values.update(writes)
    grown = range(2 * STATE_CHUNK + 10, 2 * STATE_CHUNK + 12)
    assert list(writes) == [f"{RECORD_KEY}.pieces.2", RECORD_KEY]  # one value of pieces, the head
    pieces = writes[f"{RECORD_KEY}.pieces.2"]
    assert pieces["seen"] == [f"m{n}" for n in grown]
    assert pieces["items"] == [[f"m{n}", n // 2] for n in grown]
    assert stale == []
    assert "m3" not in str(writes[RECORD_KEY])  # the head holds no per-message part
    loaded = _load(values)
    assert loaded == _record(2 * STATE_CHUNK + 12)
    assert list(loaded.keeper_state) == list(_record(1).keeper_state)  # the parts keep their place


def test_a_save_that_changes_nothing_writes_nothing() -> None:
    first, _, _ = StoredRecord(SessionRecord()).saved(_record(40))
    again, writes, stale = first.saved(_record(40))
    assert (writes, stale) == ({}, [])
    assert again.generation == first.generation


def _version_3(record: SessionRecord) -> dict[str, Any]:
    """``record`` as version 3 stored it: every list in chunks of a fixed size, each named in
    the head, the last chunk written again at every save."""
    values: dict[str, Any] = {}

    def chunks(name: str, entries: list[Any], size: int) -> list[str]:
        keys = [f"{RECORD_KEY}.{name}.{n // size}.1" for n in range(0, len(entries), size)]
        for key, start in zip(keys, range(0, len(entries), size), strict=True):
            values[key] = entries[start : start + size]
        return keys

    state = dict(record.keeper_state)
    seen = chunks("seen", list(state.pop("seen")), 256)
    items = chunks("items", [list(p) for p in state.pop("items").items()], 256)
    values[RECORD_KEY] = {
        **SessionRecord(keeper_state={**state, "seen": None, "items": None}).to_json(),
        "version": 3,
        "taken_chunks": chunks("taken", [list(p) for p in record.taken], 128),
        "taken_count": len(record.taken),
        "window_chunks": chunks("window", [message_to_dict(m) for m in record.window], 16),
        "state_chunks": {"seen": seen, "items": items},
        "generation": 1,
    }
    return values


@pytest.mark.parametrize("version", [2, 3])
def test_a_record_saved_in_an_earlier_form_still_loads(tmp_path, version: int) -> None:
    record = _record(300)
    if version == 2:  # everything inline in the head
        values = {RECORD_KEY: {**record.to_json(), "version": 2}}
    else:
        values = _version_3(record)
    archive = SQLiteArchive(str(tmp_path / "a.db"))
    archive.put_values("s", values)
    store = ArchiveSessionStore(archive)
    assert store.load("s") == record
    # the next save writes the current form, retiring every chunk of the earlier one
    store.save("s", _record(302))
    assert archive.get_value("s", RECORD_KEY)["version"] == 4
    assert ArchiveSessionStore(archive).load("s") == _record(302)
    assert not set(values) - {RECORD_KEY} & set(_keys(archive))
    archive.close()


def test_a_record_written_with_spaced_separators_loads_and_goes_on(tmp_path) -> None:
    """Values of the current form as earlier releases wrote them (``json.dumps``'s ``", "``
    and ``": "``) read as they did: stored values are only ever read by parsing them."""
    archive = SQLiteArchive(str(tmp_path / "a.db"))
    store = ArchiveSessionStore(archive)
    for count in range(2, 40, 2):
        store.save("s", _record(count))
    conn = archive._live()
    for key, text in archive._query("SELECT key, value_json FROM kv WHERE session = ?", ("s",)):
        spaced = json.dumps(json.loads(text), ensure_ascii=False, allow_nan=False)
        conn.execute(
            "UPDATE kv SET value_json = ? WHERE session = ? AND key = ?", (spaced, "s", key)
        )
    reopened = ArchiveSessionStore(archive)
    assert reopened.load("s") == _record(38)
    reopened.save("s", _record(41))
    assert ArchiveSessionStore(archive).load("s") == _record(41)
    archive.close()


def _keys(archive: SQLiteArchive) -> list[str]:
    return [row[0] for row in archive._query("SELECT key FROM kv WHERE session = ?", ("s",))]


class _InterruptedError(KeeperError):
    """The process stopped here (a crash between two writes)."""


class _OneWriteAtATime:
    """An archive without batches (each value its own write) that stops after ``writes`` writes."""

    def __init__(self, archive: SQLiteArchive, writes: int) -> None:
        self.archive = archive
        self.left = writes

    def get_value(self, session: str, key: str) -> Any:
        return self.archive.get_value(session, key)

    def put_value(self, session: str, key: str, value: Any) -> None:
        if self.left == 0:
            raise _InterruptedError(f"stopped before writing {key}")
        self.left -= 1
        self.archive.put_value(session, key, value)


@pytest.mark.parametrize("count", [30, 3 * STATE_CHUNK - 1])
def test_a_save_cut_short_at_any_write_leaves_one_whole_record(tmp_path, count: int) -> None:
    before, after = _record(count), _record(count + 2)
    outcomes = []
    for writes in range(16):
        archive = SQLiteArchive(str(tmp_path / f"a{count}-{writes}.db"))
        stopping = _OneWriteAtATime(archive, writes=1000)
        store = ArchiveSessionStore(stopping)  # type: ignore[arg-type]
        store.save("s", before)
        stopping.left = writes
        with contextlib.suppress(_InterruptedError):
            store.save("s", after)
        reopened = ArchiveSessionStore(archive).load("s")
        assert reopened in (before, after), f"cut short after {writes} writes"
        assert len(set(reopened.taken)) == len(reopened.taken)
        outcomes.append(reopened == after)
        archive.close()
    assert outcomes[0] is False and outcomes[-1] is True  # cut before any write, and after all


def test_a_long_session_leaves_no_rows_of_retired_chunks(tmp_path) -> None:
    archive = SQLiteArchive(str(tmp_path / "a.db"))
    store = ArchiveSessionStore(archive)
    for count in range(2, 3 * STATE_CHUNK + 4, 2):
        store.save("s", _record(count))
    rows = archive._query("SELECT key, value_json FROM kv WHERE session = ?", ("s",))
    assert all(value != "null" for _, value in rows)
    head = archive.get_value("s", RECORD_KEY)
    named = record_keys(head)
    assert {k for k, _ in rows if k.startswith(f"{RECORD_KEY}.")} == named
    assert ArchiveSessionStore(archive).load("s") == _record(3 * STATE_CHUNK + 2)
    archive.close()


def test_a_value_of_none_deletes_its_key(tmp_path) -> None:
    archive = SQLiteArchive(str(tmp_path / "a.db"))
    archive.put_values("s", {"kept": 1, "retired": [1, 2]})
    archive.put_values("s", {"kept": 2, "retired": None})
    assert archive.get_value("s", "retired") is None
    assert [tuple(r) for r in archive._query("SELECT key FROM kv WHERE session = ?", ("s",))] == [
        ("kept",)
    ]
    archive.close()


class _EncodingEachSave(SQLiteArchive):
    """The same archive, but handed every value whole (it says it takes no JSON texts)."""

    takes_json_text = False


def test_window_messages_written_from_their_texts_store_the_very_same_rows(tmp_path) -> None:
    """Each window message is encoded once while in view and its text joined into the values
    that hold it: the rows written are byte for byte those of encoding each value whole, odd
    text included (non-ASCII, a lone surrogate, tool calls), and they load back the same."""
    odd = [
        HumanMessage(content="café ☕ and a lone \ud800 surrogate", id="odd-0"),
        AIMessage(
            content="",
            id="odd-1",
            tool_calls=[{"name": "look", "args": {"q": "ünïcode", "n": 2.5}, "id": "c1"}],
        ),
    ]
    messages = [*odd, *_MESSAGES]
    archives = (
        SQLiteArchive(str(tmp_path / "texts.db")),
        _EncodingEachSave(str(tmp_path / "whole.db")),
    )
    stores = [ArchiveSessionStore(archive) for archive in archives]
    assert [store.texts for store in stores] == [True, False]
    for count in (1, 2, 5, 9, 16, 17, 18, 33, 40, 41):
        ids = [str(m.id) for m in messages[:count]]
        record = SessionRecord(
            window=tuple(messages[:count]),
            keeper_state={"seen": ids, "items": {i: n for n, i in enumerate(ids)}},
            taken=tuple((f"d{n}", i) for n, i in enumerate(ids)),
        )
        for store in stores:
            store.save("s", record)
    rows = [
        archive._query("SELECT key, value_json FROM kv WHERE session = ? ORDER BY key", ("s",))
        for archive in archives
    ]
    assert [tuple(row) for row in rows[0]] == [tuple(row) for row in rows[1]]
    assert any(key.startswith(f"{RECORD_KEY}.window.") for key, _ in rows[0])  # a full chunk
    loaded = [ArchiveSessionStore(archive).load("s") for archive in archives]
    assert loaded[0] == loaded[1] == record
    for archive in archives:
        archive.close()


def test_a_window_message_that_is_not_json_able_is_refused_naming_the_value(tmp_path) -> None:
    archive = SQLiteArchive(str(tmp_path / "a.db"))
    store = ArchiveSessionStore(archive)
    bad = AIMessage(content="x", id="bad", additional_kwargs={"score": float("nan")})
    with pytest.raises(KeeperError, match="must be JSON-able"):
        store.save("s", SessionRecord(window=(bad,)))
    assert archive.get_value("s", RECORD_KEY) is None
    archive.close()
