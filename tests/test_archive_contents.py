"""What is archived reads back as it was written: turns by an inclusive item range or after a
seq, notes versions streamed one at a time (never all loaded together), any text in any script at
a megabyte word for word, a message's tool calls and reasoning kept apart from its text, and JSON
values per session, several written all or none."""

from __future__ import annotations

import json
import tracemalloc

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from keeper_middleware.archive.records import ArchivedTurn, NotesDraft, turn_from_message
from keeper_middleware.archive.sqlite import SQLiteArchive
from keeper_middleware.archive.store import put_values
from tests.archive_stores import (
    _fields,
    make_turns,
    open_store,
    spec_fixture,  # noqa: F401
    store_fixture,  # noqa: F401
)


def test_turns_filter_by_inclusive_item_range_and_after_seq(store):
    store.commit_cut(
        "s",
        cut_key="setup",
        turns=[ArchivedTurn(session="s", msg_id="sys", item=None, role="system", content="task")],
        notes=None,
    )
    for cut in (1, 2, 3, 4):
        store.commit_cut("s", cut_key=f"cut-{cut}", turns=make_turns("s", cut, 2), notes=None)
    assert {t.item for t in store.turns("s", from_item=2, to_item=3)} == {2, 3}
    assert [t.item for t in store.turns("s", to_item=1)] == [1, 1]
    assert [t.seq for t in store.turns("s", after_seq=6)] == [7, 8]
    assert next(store.turns("s")).item is None


def test_notes_versions_stream_instead_of_loading_every_version(spec):
    with open_store(spec) as archive:
        big = "n" * 1_000_000
        for cut in range(40):
            draft = NotesDraft(first_item=0, last_item=cut, text=f"{cut} {big}")
            archive.commit_cut("s", cut_key=f"cut-{cut}", turns=(), notes=draft)
        tracemalloc.start()
        try:
            seen = sum(1 for _ in archive.notes_versions("s"))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert seen == 40
    assert peak < 20_000_000, f"peak {peak} bytes: versions were loaded together (40 MB in all)"


def test_unicode_and_a_megabyte_of_content_round_trip_word_for_word(store):
    text = "Zürich ✓ 日本語 😀 a\x00b \u2028 " + "ω" * 1_000_000
    turn = ArchivedTurn(
        session="s",
        msg_id="m",
        item=1,
        role="ai",
        content=text,
        tool_calls_json=json.dumps([{"name": "search_archive", "args": {"query": "δ"}, "id": "c"}]),
        name="bot",
        reasoning="thinking… " + text,
    )
    store.commit_cut("s", cut_key="k", turns=[turn], notes=None)
    assert next(store.turns("s")) == ArchivedTurn(**{**_fields(turn), "seq": 0})


def test_values_are_upserted_per_session_and_must_be_json(store):
    assert store.get_value("s", "guard") is None
    store.put_value("s", "guard", {"repeats": 1, "last": "domo86"})
    store.put_value("s", "guard", {"repeats": 2, "last": "domo86"})
    store.put_value("t", "guard", [1])
    assert store.get_value("s", "guard") == {"repeats": 2, "last": "domo86"}
    assert store.get_value("t", "guard") == [1]
    with pytest.raises(TypeError, match="JSON-able"):
        store.put_value("s", "bad", object())
    with pytest.raises(TypeError, match="JSON-able"):
        store.put_value("s", "bad", float("nan"))


def test_several_values_are_written_all_or_none(store):
    store.put_value("s", "kept", "before")
    put_values(store, "s", {"a": 1, "b": [2, "two"], "kept": "after"})
    assert [store.get_value("s", k) for k in ("a", "b", "kept")] == [1, [2, "two"], "after"]
    with pytest.raises(TypeError, match="JSON-able"):
        put_values(store, "s", {"a": 10, "bad": object(), "kept": "lost"})
    assert (store.get_value("s", "a"), store.get_value("s", "kept")) == (1, "after")
    assert store.get_value("s", "bad") is None


class _OneValueAtATime:
    """A store with only ``put_value`` (as a backend without batches would be)."""

    def __init__(self, inner: SQLiteArchive) -> None:
        self.inner = inner
        self.writes: list[str] = []

    def put_value(self, session: str, key: str, value: object) -> None:
        self.writes.append(key)
        self.inner.put_value(session, key, value)


def test_a_store_without_batches_gets_the_values_one_by_one_in_order(store):
    plain = _OneValueAtATime(store)
    put_values(plain, "s", {"chunk": [1], "head": {"n": 1}, "old": None})  # type: ignore[arg-type]
    assert plain.writes == ["chunk", "head", "old"]
    assert store.get_value("s", "head") == {"n": 1}


def test_turn_from_message_keeps_tool_calls_and_reasoning_apart():
    ai = AIMessage(
        content=[{"type": "text", "text": "Let me look."}],
        id="a1",
        tool_calls=[{"name": "search_archive", "args": {"query": "domo86"}, "id": "call-1"}],
        additional_kwargs={"reasoning_content": "The value is old."},
    )
    turn = turn_from_message(ai, session="s", item=7)
    assert (turn.role, turn.content, turn.reasoning, turn.item) == (
        "ai",
        "Let me look.",
        "The value is old.",
        7,
    )
    assert json.loads(turn.tool_calls_json)[0]["args"] == {"query": "domo86"}
    tool = turn_from_message(
        ToolMessage("Found 2 matches", tool_call_id="call-1", name="search_archive", id="t1"),
        session="s",
        item=7,
    )
    assert (tool.role, tool.tool_call_id, tool.name) == ("tool", "call-1", "search_archive")
    with pytest.raises(ValueError, match="give every message an id"):
        turn_from_message(HumanMessage("no id"), session="s", item=None)
