"""A session record saved as a change stays exactly the record through every kind of change a
proxy makes to it: messages appended (a few or many at once), the end taken back (a regenerate,
an edit), a message in the middle replaced, the front cut, an item number changed. After every
save the archive loads the same record back and holds no chunk its head does not name."""

from __future__ import annotations

import random
from dataclasses import replace

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from keeper_middleware.archive.sqlite.archive import SQLiteArchive
from keeper_middleware.integrations.proxy.sessions.records import (
    RECORD_KEY,
    ArchiveSessionStore,
    SessionRecord,
    record_keys,
)


def _message(n: int) -> BaseMessage:
    return (HumanMessage if n % 2 == 0 else AIMessage)(content=f"line {n}", id=f"m{n}")


def _record(messages: list[BaseMessage], items: dict[str, int]) -> SessionRecord:
    ids = [str(m.id) for m in messages]
    return SessionRecord(
        window=tuple(messages),
        keeper_state={"seen": ids, "items": dict(items), "room": 900},
        taken=tuple((f"d-{i}", i) for i in ids),
    )


def _changed(rng: random.Random, messages: list[BaseMessage], made: int) -> list[BaseMessage]:
    """``messages`` after one change, picked at random; ``made`` numbers the new ones."""
    change = rng.choice(["append", "append", "append", "many", "back", "edit", "cut", "none"])
    if change == "append":
        return [*messages, *(_message(made + n) for n in range(rng.randint(1, 3)))]
    if change == "many":
        return [*messages, *(_message(made + n) for n in range(rng.randint(20, 300)))]
    if change == "back" and messages:
        return messages[: rng.randrange(len(messages))]
    if change == "edit" and messages:
        place = rng.randrange(len(messages))
        return [*messages[:place], _message(made), *messages[place + 1 :]]
    if change == "cut" and messages:
        return messages[rng.randint(1, max(1, len(messages) // 2)) :]
    return list(messages)


def test_every_kind_of_change_loads_back_exactly_and_leaves_no_stray_chunk(tmp_path) -> None:
    rng = random.Random(7)
    archive = SQLiteArchive(str(tmp_path / "a.db"))
    store = ArchiveSessionStore(archive)
    messages: list[BaseMessage] = []
    items: dict[str, int] = {}
    for step in range(120):
        messages = _changed(rng, messages, made=1000 * step)
        items = {str(m.id): items.get(str(m.id), n) for n, m in enumerate(messages)}
        if messages and rng.random() < 0.1:  # an item number changed in place
            items[str(rng.choice(messages).id)] = -step
        record = _record(messages, items)
        if step % 5 == 0:
            record = replace(record, withdrawn=((f"w{step}", f"m{step}"),))
        store.save("s", record)
        assert ArchiveSessionStore(archive).load("s") == record, f"after step {step}"
        head = archive.get_value("s", RECORD_KEY)
        named = record_keys(head)
        rows = archive._query("SELECT key FROM kv WHERE session = ?", ("s",))
        assert {r[0] for r in rows if r[0].startswith(f"{RECORD_KEY}.")} == named
    archive.close()
