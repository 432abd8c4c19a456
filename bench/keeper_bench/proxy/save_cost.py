"""What saving a proxy session's record costs as its window grows (no proxy, no HTTP).

``python -m keeper_bench.proxy.save_cost 200,1000,2000,5000``: a session record of that many
window messages (a tool loop: a call and its result a round), with the keeper state a step leaves
(the ids taken in and their item numbers) and one fingerprint per message, saved once; then 30
saves each after one more round, as keeper-proxy saves after every request. The table gives the
median thread CPU of one save (:meth:`ArchiveSessionStore.save_all`, SQLite on disk).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from keeper_bench.proxy.servers import READ_NEXT

__all__ = ["save_cpu_ms"]


def _round(number: int) -> list[BaseMessage]:
    call = {"name": READ_NEXT, "args": {}, "id": f"c{number}"}
    text = f"Line {number}: the clerk recorded parcel {number * 7} at the harbour."
    return [
        AIMessage("", id=f"a{number}-{os.urandom(8).hex()}", tool_calls=[call]),
        ToolMessage(text, tool_call_id=f"c{number}", id=f"t{number}-{os.urandom(8).hex()}"),
    ]


def save_cpu_ms(length: int, saves: int = 30) -> float:
    """Median thread CPU, in ms, of one save of a record whose window holds ``length``
    messages, each save after one more round."""
    from keeper_middleware.archive.sqlite.archive import SQLiteArchive
    from keeper_middleware.integrations.proxy.sessions.metrics import ProxyStats
    from keeper_middleware.integrations.proxy.sessions.records import (
        ArchiveSessionStore,
        SessionRecord,
    )

    messages: list[BaseMessage] = [HumanMessage("Read the whole record and report.", id="task")]
    number = 0
    while len(messages) < length:
        number += 1
        messages += _round(number)

    seen: list[str] = []
    items: dict[str, int] = {}
    taken: tuple[tuple[str, str], ...] = ()

    def record() -> SessionRecord:
        """The record after the messages new since the last one, built as the proxy and the
        keeper build it: new lists and a new mapping each request, holding the same entries
        (the same objects) as before and the new ones after them."""
        nonlocal seen, items, taken
        new = [str(m.id) for m in messages[len(seen) :]]
        seen = [*seen, *new]
        items = {**items, **{i: n // 2 for n, i in enumerate(new, len(items))}}
        taken = (*taken, *((f"d-{i}", i) for i in new))
        state = {
            "seen": seen,
            "items": items,
            "items_since_notes": len(seen) // 2,
            "notes_item": 0,
            "room": 900,
        }
        return SessionRecord(window=tuple(messages), keeper_state=state, taken=taken)

    with tempfile.TemporaryDirectory() as folder:
        archive = SQLiteArchive(str(Path(folder) / "archive.db"))
        store = ArchiveSessionStore(archive)
        stats = ProxyStats()
        store.save_all("s", record(), stats)
        times = []
        for _ in range(saves):
            number += 1
            messages += _round(number)
            saved = record()
            started = time.thread_time()
            store.save_all("s", saved, stats)
            times.append(time.thread_time() - started)
        archive.close()
    return 1000 * statistics.median(times)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m keeper_bench.proxy.save_cost 200,1000,2000,5000``: a session record's save
    CPU at each number of window messages."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("lengths", nargs="?", default="200,1000,2000,5000")
    parser.add_argument("--saves", type=int, default=30)
    args = parser.parse_args(argv)
    print(
        "| messages in the window | one save's CPU (ms, median) | load avg |\n| --- | --- | --- |"
    )
    for length in (int(n) for n in args.lengths.split(",") if n):
        cpu = save_cpu_ms(length, args.saves)
        print(f"| {length:,} | {cpu:.2f} | {os.getloadavg()[0]:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
