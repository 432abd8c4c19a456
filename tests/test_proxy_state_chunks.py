"""The keeper state's per-message parts (the ids taken in and their item numbers) are saved as a
change: a request that appends messages rewrites only their last chunks and a small head, a
record saved in the previous form still loads, and a save cut short at any write leaves the
previous record or the new one whole, never a mix (no turn lost or counted twice)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from keeper_middleware.archive.sqlite.archive import SQLiteArchive
from keeper_middleware.errors import KeeperError
from keeper_middleware.integrations.proxy.sessions.records import (
    RECORD_KEY,
    STATE_CHUNK,
    ArchiveSessionStore,
    SessionRecord,
    StoredRecord,
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


def test_a_save_after_an_append_rewrites_only_the_states_last_chunks() -> None:
    first, writes, _ = StoredRecord(SessionRecord()).saved(_record(2 * STATE_CHUNK + 10))
    values = dict(writes)
    _, writes, stale = first.saved(_record(2 * STATE_CHUNK + 12))
    values.update(writes)
    state_writes = [
        k for k in writes if k.startswith((f"{RECORD_KEY}.seen", f"{RECORD_KEY}.items"))
    ]
    assert state_writes == [
        first.state_keys["seen"][-1][:-2] + ".2",
        first.state_keys["items"][-1][:-2] + ".2",
    ]
    assert {first.state_keys["seen"][-1], first.state_keys["items"][-1]} <= set(stale)
    assert "m3" not in str(writes[RECORD_KEY])  # the head holds no per-message part
    loaded = _load(values)
    assert loaded == _record(2 * STATE_CHUNK + 12)
    assert list(loaded.keeper_state) == list(_record(1).keeper_state)  # the parts keep their place


def test_a_record_saved_in_the_previous_form_still_loads() -> None:
    record = _record(40)
    _, writes, _ = StoredRecord(SessionRecord()).saved(record)
    head = {**writes[RECORD_KEY], "version": 2, "keeper_state": dict(record.keeper_state)}
    del head["state_chunks"]
    values = {**writes, RECORD_KEY: head}
    assert _load(values) == record
    # and the next save writes the new form, which loads the same
    stored = StoredRecord.load(head, values.get)
    _, writes, _ = stored.saved(_record(42))
    values.update(writes)
    assert writes[RECORD_KEY]["version"] == 3
    assert _load(values) == _record(42)


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
    named = {*head["taken_chunks"], *head["window_chunks"]}
    named |= {k for part in head["state_chunks"].values() for k in part}
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
