"""A session record read back equals the record saved, whatever happened to it between saves.

Random sequences of what a proxy's session goes through (messages appended, a cut that drops
the oldest, an edit or a regenerate that replaces the newest, a message withdrawn, a save that
changes nothing), each saved to a SQLite archive as the proxy saves it (window messages as
their texts, the pieces joined, full chunks written, retired values cleared): after every save
a store that knows nothing reads the same record, and the archive holds exactly the values the
head names, no row left behind."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from keeper_middleware.archive.sqlite.archive import SQLiteArchive
from keeper_middleware.integrations.proxy.sessions.metrics import ProxyStats
from keeper_middleware.integrations.proxy.sessions.records import (
    RECORD_KEY,
    STATS_KEY,
    ArchiveSessionStore,
    SessionRecord,
    record_keys,
)

_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 90)),
        st.tuples(st.just("cut"), st.integers(1, 60)),
        st.tuples(st.just("edit"), st.integers(1, 3)),
        st.tuples(st.just("withdraw"), st.just(0)),
        st.tuples(st.just("same"), st.just(0)),
    ),
    min_size=1,
    max_size=25,
)


class _Session:
    """A session as a proxy keeps it: the same message objects from save to save."""

    def __init__(self) -> None:
        self.made = 0
        self.record = SessionRecord(keeper_state={"room": 1000, "seen": [], "items": {}})

    def _message(self) -> BaseMessage:
        self.made += 1
        n = self.made
        kind = (HumanMessage, AIMessage, ToolMessage)[n % 3]
        text = f"message {n} ünïcode" if n % 5 else f"message {n} with a float 2.5e-7"
        if kind is ToolMessage:
            return ToolMessage(text, tool_call_id=f"c{n}", id=f"m{n}")
        return kind(text, id=f"m{n}")

    def _with_window(self, window: tuple[BaseMessage, ...], taken: int) -> None:
        ids = [str(m.id) for m in window]
        state = {
            "room": 1000 - len(window),
            "seen": ids,
            "items": {i: n // 2 for n, i in enumerate(ids)},
        }
        fresh = tuple((f"d{m.id}", str(m.id)) for m in window[len(window) - taken :])
        self.record = replace(
            self.record,
            window=window,
            keeper_state=state,
            taken=(*self.record.taken, *fresh) if taken else self.record.taken,
        )

    def apply(self, step: str, amount: int) -> None:
        window = self.record.window
        if step == "append":
            self._with_window((*window, *(self._message() for _ in range(amount))), amount)
        elif step == "cut":
            self._with_window(window[min(amount, len(window)) :], 0)
        elif step == "edit" and window:
            kept = window[: max(0, len(window) - amount)]
            replaced = tuple(self._message() for _ in range(len(window) - len(kept)))
            self._with_window((*kept, *replaced), len(replaced))
        elif step == "withdraw" and self.record.taken:
            *taken, last = self.record.taken
            self.record = replace(
                self.record, taken=tuple(taken), withdrawn=(*self.record.withdrawn, last)
            )


@settings(max_examples=60, deadline=None)
@given(_STEPS)
def test_a_record_read_back_equals_the_record_saved(steps: list[tuple[str, int]]) -> None:
    archive = SQLiteArchive(":memory:")
    store = ArchiveSessionStore(archive)
    session = _Session()
    for number, (step, amount) in enumerate(steps, 1):
        session.apply(step, amount)
        store.save_all("s", session.record, ProxyStats(requests=number))
        assert ArchiveSessionStore(archive).load("s") == session.record, (number, step)
        head = archive.get_value("s", RECORD_KEY)
        rows = {row[0] for row in archive._query("SELECT key FROM kv WHERE session = ?", ("s",))}
        assert rows == {RECORD_KEY, STATS_KEY, *record_keys(head)}, (number, step)
    assert archive.get_value("s", STATS_KEY)["requests"] == len(steps)
    archive.close()
