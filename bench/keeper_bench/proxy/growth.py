"""keeper-proxy's CPU a request as a session's history grows (``proxy-overhead --history``).

Each session first sends a history of a given length (the task, then rounds of a ``read_next``
call and its result, one stream message each) and the proxy takes it in; that request is not
measured, nor is the work it leaves running in the background (keeper-proxy indexes the turns a
take-in archived for search): every process is left to idle (:func:`settled`) before the session
makes ``--history-calls`` calls in its tool loop, each resending the whole history with one more
round, and the CPU each path spends on those calls is read from its process as in the main table.
Where the window holds the whole history, every message stays in view and what grows is only the
history each request carries; where it cannot (thousands of messages in a 32K window), the take-in
archives the oldest turns and the calls after it resend them, matched against the archived ones.

The relay is measured beside it because it too parses and forwards the whole history, so its
CPU grows with the history's bytes; the question is whether keeper-proxy's grows faster.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from keeper_bench.proxy.servers import READ_NEXT, ProxyProcess, upstream_server
from keeper_bench.steps import SYSTEM_PROMPT

__all__ = [
    "GROWTH_HEADER",
    "GrowthRow",
    "growth_header",
    "growth_markdown",
    "measure_growth",
    "pass_order",
    "settle_lines",
    "settled",
    "starting_history",
    "thread_lines",
]

GROWTH_PATHS = ("relay", "floor", "keeping", "keeper-proxy", "baseline")


def pass_order(paths: Sequence[str], number: int) -> list[str]:
    """The order of the paths in pass ``number``: as given, but the two keeper-proxies (this
    checkout's and the baseline's) trade places every other pass. Whichever process runs later
    in a pass reads lower on a machine whose load drifts within the pass, so a fixed order would
    favour one checkout in every row; alternating it splits that bias between the two."""
    order = list(paths)
    if number % 2 and "keeper-proxy" in order and "baseline" in order:
        first, second = order.index("keeper-proxy"), order.index("baseline")
        order[first], order[second] = order[second], order[first]
    return order


TARGET_RATIO = 2.0
"""keeper-proxy's CPU a request at most this many times the fair floor's, at every size."""
TARGET_SLOPE = 1.5
"""The cost of one more resent message from 1,000 to 5,000 at most this many times 200 to 1,000."""


def starting_history(inputs: Sequence[str], length: int) -> list[dict[str, Any]]:
    """A tool-loop history of ``length`` messages: system, task, then call and result rounds
    (the stream's messages as results, over again when the history is longer than the stream)."""
    history: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": inputs[0]},
    ]
    texts = inputs[1:] or inputs
    number = 0
    while len(history) + 2 <= max(length, 2):
        call_id = f"call_h{number}"
        history.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": READ_NEXT, "arguments": "{}"},
                    }
                ],
            }
        )
        history.append(
            {"role": "tool", "tool_call_id": call_id, "content": texts[number % len(texts)]}
        )
        number += 1
    return history


@dataclass(slots=True)
class GrowthRow:
    """One history length: each path's CPU a request and p50, pass by pass."""

    history: int
    sessions: int
    cpu_ms: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in GROWTH_PATHS})
    p50_ms: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in GROWTH_PATHS})
    load_before: float = 0.0
    load_after: float = 0.0
    settle_s: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in GROWTH_PATHS})
    """Seconds each path's process took to idle after the take-in, pass by pass."""
    loop_ms: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in GROWTH_PATHS})
    """CPU a request of each path's event loop (its main thread) alone, pass by pass: the rest
    of ``cpu_ms`` is its other threads' (worker threads, background indexing)."""

    def ratios(self, floor: str = "floor") -> list[float]:
        """keeper-proxy's CPU a request over the fair floor's (``floor="keeping"``: the keeping
        floor's), pass by pass; empty when that floor was not measured."""
        floors = self.cpu_ms[floor]
        if not floors:
            return []
        pairs = zip(floors, self.cpu_ms["keeper-proxy"], strict=True)
        return [p / f for f, p in pairs if f]

    def line(self) -> str:
        relay, proxy = self.cpu_ms["relay"], self.cpu_ms["keeper-proxy"]
        ratios, kept = self.ratios(), self.ratios("keeping")
        base, keeping = self.cpu_ms["baseline"], self.cpu_ms["keeping"]
        return (
            f"| {self.history:,} | {self.sessions} | {_spread(relay)} | "
            f"{_spread(self.cpu_ms['floor'])} | {_spread(keeping) if keeping else '–'} | "
            f"{_spread(proxy)} | "
            + (f"{_spread(base)} | " if base else "")
            + f"{_spread(self.p50_ms['keeper-proxy'], '{:.1f}')} | "
            f"{_spread(ratios) if ratios else '–'} | {_spread(kept) if kept else '–'} | "
            f"{self.load_before:.1f} → {self.load_after:.1f} |"
        )


def _spread(values: Sequence[float], form: str = "{:.2f}") -> str:
    middle = form.format(statistics.median(values))
    if len(values) < 2:
        return middle
    return f"{middle} ({form.format(min(values))}–{form.format(max(values))})"


SETTLE_EVERY = 0.1
"""Seconds between two reads of a process's CPU while waiting for it to idle."""
SETTLE_QUIET = 0.002
"""CPU seconds a process may spend in ``SETTLE_EVERY`` and count as idle."""


async def settled(middle: ProxyProcess, limit: float = 120.0) -> float:
    """Wait until ``middle`` idles (under ``SETTLE_QUIET`` seconds of CPU in ``SETTLE_EVERY``),
    so that the background work an unmeasured request left (indexing what a take-in archived)
    is not counted to the measured calls after it; the seconds waited. A process still busy
    after ``limit`` seconds is measured as it is (the wait is reported beside the table)."""
    started = time.perf_counter()
    last = middle.cpu_seconds()
    while time.perf_counter() - started < limit:
        await asyncio.sleep(SETTLE_EVERY)
        now = middle.cpu_seconds()
        if now - last < SETTLE_QUIET:
            break
        last = now
    return time.perf_counter() - started


async def _grow(
    url: str,
    start: Sequence[dict[str, Any]],
    texts: Sequence[str],
    sessions: int,
    tag: str,
    middle: ProxyProcess,
) -> tuple[float, list[float], float, float]:
    """Every session takes its starting history in (not measured, nor what it leaves running:
    :func:`settled`), then makes its calls; the CPU ``middle`` spent on the calls, in seconds,
    each call's round trip, the seconds ``middle`` took to idle after the take-in, and the CPU
    its event loop's thread alone spent on the calls."""
    import aiohttp

    histories = [list(start) for _ in range(sessions)]

    async def call(client: aiohttp.ClientSession, number: int, text: str | None) -> float:
        history = histories[number]
        headers = {"x-keeper-session": f"{tag}-{number}", "content-type": "application/json"}
        body = orjson.dumps({"model": "instant", "messages": history, "tools": [_TOOL]})
        started = time.perf_counter()
        async with client.post(f"{url}/v1/chat/completions", data=body, headers=headers) as got:
            data = await got.read()
            if got.status != 200:
                raise RuntimeError(f"{url} answered {got.status}: {data[:300]!r}")
        took = time.perf_counter() - started
        reply = orjson.loads(data)["choices"][0]["message"]
        history.append(reply)
        for made in reply.get("tool_calls") or []:
            history.append({"role": "tool", "tool_call_id": made["id"], "content": text or "."})
        if not reply.get("tool_calls"):
            history.append({"role": "user", "content": text or "."})
        return took

    async def calls(client: aiohttp.ClientSession, number: int) -> list[float]:
        return [await call(client, number, text) for text in texts]

    connector = aiohttp.TCPConnector(limit=sessions + 1)
    async with aiohttp.ClientSession(connector=connector) as client:
        await asyncio.gather(*(call(client, n, texts[0]) for n in range(sessions)))
        waited = await settled(middle)
        before, loop_before = middle.cpu_seconds(), middle.loop_cpu_seconds()
        runs = await asyncio.gather(*(calls(client, n) for n in range(sessions)))
        spent = middle.cpu_seconds() - before
        on_loop = middle.loop_cpu_seconds() - loop_before
    return spent, [t for run in runs for t in run], waited, on_loop


_TOOL = {
    "type": "function",
    "function": {
        "name": READ_NEXT,
        "description": "Read the next part of the record.",
        "parameters": {"type": "object", "properties": {}},
    },
}


def measure_growth(
    inputs: Sequence[str],
    *,
    lengths: Sequence[int],
    calls: int,
    sessions: int,
    repeat: int,
    window: int,
    archive: Path,
    start_relay: Callable[[ProxyProcess], Any],
    start_proxy: Callable[..., Any],
    start_floor: Callable[[ProxyProcess, Path | None], Any],
    start_keeping: Callable[[ProxyProcess, Path], Any] | None = None,
    baseline: Path | None = None,
    report: Callable[[str], None] = print,
) -> list[GrowthRow]:
    """One row per history length, the relay, the fair floor, the keeping floor (with
    ``start_keeping``) and keeper-proxy (and the ``baseline`` checkout's keeper-proxy) in
    interleaved passes, in front of an upstream that answers at once."""
    texts = list(inputs[1 : calls + 1]) or [inputs[0]]
    rows: list[GrowthRow] = []
    with ExitStack() as stack:
        upstream = stack.enter_context(upstream_server(0.0))
        relay = stack.enter_context(start_relay(upstream))
        floor = stack.enter_context(
            start_floor(upstream, archive.with_name(archive.name + ".floor"))
        )
        middles = {"relay": relay, "floor": floor}
        if start_keeping is not None:
            middles["keeping"] = stack.enter_context(
                start_keeping(upstream, archive.with_name(archive.name + ".keeping"))
            )
        middles["keeper-proxy"] = stack.enter_context(start_proxy(upstream, window, archive))
        if baseline is not None:
            middles["baseline"] = stack.enter_context(
                start_proxy(
                    upstream, window, archive.with_name(archive.name + "-baseline"), baseline
                )
            )
        for path in middles:  # warm: start-up and lazy imports are not measured
            url = middles[path].url
            asyncio.run(
                _grow(url, starting_history(inputs, 6), texts[:3], 1, f"warm-{path}", middles[path])
            )
        for length in lengths:
            row = GrowthRow(length, sessions, load_before=os.getloadavg()[0])
            start = starting_history(inputs, length)
            for number in range(repeat):
                # counted across rows, so an odd --repeat is balanced over the table
                order = pass_order(list(middles), len(rows) * repeat + number)
                for path in order:
                    tag = f"grow-{path}-{length}-{number}"
                    spent, times, waited, on_loop = asyncio.run(
                        _grow(middles[path].url, start, texts, sessions, tag, middles[path])
                    )
                    row.settle_s[path].append(waited)
                    row.cpu_ms[path].append(1000 * spent / max(1, len(times)))
                    row.loop_ms[path].append(1000 * on_loop / max(1, len(times)))
                    row.p50_ms[path].append(1000 * statistics.median(times))
            row.load_after = os.getloadavg()[0]
            rows.append(row)
            report(row.line())
    return rows


GROWTH_HEADER = (
    "| messages resent | sessions | bare relay CPU a request (ms) | fair floor CPU a request "
    "(ms) | keeping floor CPU a request (ms) | keeper-proxy CPU a request (ms) | keeper-proxy "
    "p50 (ms) | proxy ÷ floor CPU | proxy ÷ keeping floor CPU | load avg |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def growth_header(baseline: str | None) -> str:
    """The growth table's header (with the baseline's column when one was measured)."""
    if baseline is None:
        return GROWTH_HEADER
    head, rule = GROWTH_HEADER.split("\n")
    head = head.replace(
        "| keeper-proxy p50", f"| keeper-proxy at {baseline} CPU a request (ms) | keeper-proxy p50"
    )
    return f"{head}\n{rule} --- |"


def growth_verdict(rows: Sequence[GrowthRow]) -> list[str]:
    """The targets: keeper-proxy within twice the fair floor at every size, and the cost of
    one more resent message flat (1,000 -> 5,000 against 200 -> 1,000)."""
    lines = []
    for row in rows:
        if row.ratios():
            ratio = statistics.median(row.ratios())
            met = "met" if ratio <= TARGET_RATIO else "not met"
            lines.append(
                f"- {row.history:,} messages, {row.sessions} session(s): keeper-proxy spends "
                f"{ratio:.2f}× the fair floor's CPU a request (target ≤ {TARGET_RATIO:g}×): {met}."
            )
        if row.ratios("keeping"):
            lines.append(
                f"- {row.history:,} messages, {row.sessions} session(s): keeper-proxy spends "
                f"{statistics.median(row.ratios('keeping')):.2f}× the keeping floor's CPU a "
                "request (a reference, not a target: what the keeper adds beyond the least a "
                "proxy under its rules does)."
            )
    cost = {row.history: statistics.median(row.cpu_ms["keeper-proxy"]) for row in rows}
    if all(n in cost for n in (200, 1000, 5000)):
        low = (cost[1000] - cost[200]) / 800 * 1000
        high = (cost[5000] - cost[1000]) / 4000 * 1000
        met = "met" if high <= TARGET_SLOPE * max(low, 1e-9) else "not met"
        lines.append(
            f"- one more resent message costs keeper-proxy {low:.1f} µs from 200 to 1,000 and "
            f"{high:.1f} µs from 1,000 to 5,000 ({high / max(low, 1e-9):.2f}×; target ≤ "
            f"{TARGET_SLOPE:g}×): {met}."
        )
    return lines


def settle_lines(rows: Sequence[GrowthRow]) -> list[str]:
    """How long each path's process took to idle after the take-in, at its longest, when any
    took longer than one read (the background work the table leaves out, shown)."""
    longest = {
        path: max(waits)
        for path in GROWTH_PATHS
        if (waits := [w for row in rows for w in row.settle_s[path]])
    }
    if all(w <= 2 * SETTLE_EVERY for w in longest.values()):
        return []
    named = ", ".join(f"{path} {w:.1f} s" for path, w in longest.items())
    return [
        f"- Left out: the work a take-in leaves running (keeper-proxy indexes the turns it "
        f"archived). Longest wait for each process to idle before its calls: {named}.",
    ]


THREAD_PATHS = {
    "floor": "fair floor",
    "keeping": "keeping floor",
    "keeper-proxy": "keeper-proxy",
    "baseline": "baseline keeper-proxy",
}
"""The paths whose CPU is split by thread, with their names in the table."""


def thread_lines(rows: Sequence[GrowthRow]) -> list[str]:
    """Each path's CPU a request split between its event loop's thread and every other thread
    (medians of the passes): where a proxy's own work runs, and what its hand-offs move off the
    loop. Empty when no path's event loop was read."""
    paths = [path for path in THREAD_PATHS if any(row.loop_ms[path] for row in rows)]
    if not paths:
        return []
    lines = [
        "Where each path's CPU a request went (ms, medians of the passes): its event loop's "
        "thread / every other thread (worker threads, and keeper-proxy's background indexing).",
        "",
        "| messages | " + " | ".join(THREAD_PATHS[path] for path in paths) + " |",
        "| --- |" + " --- |" * len(paths),
    ]
    for row in rows:
        cells = []
        for path in paths:
            loop, whole = row.loop_ms[path], row.cpu_ms[path]
            if not loop:
                cells.append("–")
                continue
            others = [total - on_loop for total, on_loop in zip(whole, loop, strict=True)]
            cells.append(f"{statistics.median(loop):.2f} / {statistics.median(others):.2f}")
        lines.append(f"| {row.history:,} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def growth_markdown(
    rows: Sequence[GrowthRow],
    *,
    calls: int,
    window: int,
    baseline: str | None = None,
    title: str = "As the history grows",
) -> list[str]:
    """The growth table and what it measured, as lines of the results file."""
    if not rows:
        return []
    return [
        f"## {title}",
        "",
        f"Each session first sends a history of the given length (not measured, nor the work "
        "it leaves running in the background: each process is left to idle first, under "
        f"{1000 * SETTLE_QUIET:.0f} ms of CPU in {1000 * SETTLE_EVERY:.0f} ms), then makes "
        f"{calls} calls in its tool loop, each resending the whole history with one more call "
        f"and result; keeper-proxy's window is {window:,} tokens. Instant upstream; CPU a "
        "request as in the table above, over those calls only. The *fair floor* is the bare "
        "relay that also parses each JSON body and commits one SQLite row per request before "
        "forwarding it (`python -m keeper_bench.proxy.relay --floor FILE`); the *keeping floor* "
        "(`--keeping FILE`) is the least a proxy does under keeper-proxy's own rules: it also "
        "encodes its own upstream body, keeps each reply with the request's new turn in one "
        "committed row, and does its token count and SQLite work in worker threads (two "
        "hand-offs a request), never on the event loop.",
        "",
        growth_header(baseline),
        *(row.line() for row in rows),
        "",
        *settle_lines(rows),
        *growth_verdict(rows),
        "",
        *thread_lines(rows),
    ]


# -- the keeper step alone ------------------------------------------------------------------------
def step_cpu_ms(length: int, steps: int = 30) -> float:
    """Median CPU time (this thread's) of one :meth:`Keeper.step` with ``length`` messages in
    view and nothing cut, each step adding a call and its result to the same message objects,
    as an adapter hands them over."""
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

    from keeper_middleware.config import KeeperConfig
    from keeper_middleware.keeper import Keeper, ModelSetup

    keeper = Keeper(KeeperConfig(window=4_000_000), archive=":memory:")
    setup = ModelSetup(system_prompt=SYSTEM_PROMPT, tools=())
    messages: list[BaseMessage] = [HumanMessage("Read the whole record and report.", id="task")]

    def add(number: int) -> None:
        call = {"name": READ_NEXT, "args": {}, "id": f"c{number}"}
        messages.append(AIMessage("", id=f"a{number}", tool_calls=[call]))
        text = f"Line {number}: the clerk recorded parcel {number * 7} at the harbour."
        messages.append(ToolMessage(text, tool_call_id=f"c{number}", id=f"t{number}"))

    def note(request: Sequence[BaseMessage], kwargs: Any) -> AIMessage:
        return AIMessage("NO CHANGES")

    number = 0
    while len(messages) < length:
        number += 1
        add(number)
    state: dict[str, Any] | None = None
    result = keeper.step("s", list(messages), state, setup, note)
    messages[:], state = result.messages, result.state
    times = []
    for _ in range(steps):
        number += 1
        add(number)
        started = time.thread_time()
        result = keeper.step("s", list(messages), state, setup, note)
        times.append(time.thread_time() - started)
        if result.cut:
            raise RuntimeError("a step cut: the window is too small for this history")
        messages[:], state = result.messages, result.state
    keeper.close()
    return 1000 * statistics.median(times)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m keeper_bench.proxy.growth 20,200,1000``: the keeper step's CPU at
    each number of messages in view (no proxy, no HTTP)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("lengths", nargs="?", default="20,200,1000")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args(argv)
    print("| messages in view | keeper step CPU (ms, median) | load avg |\n| --- | --- | --- |")
    for length in (int(n) for n in args.lengths.split(",") if n):
        print(f"| {length:,} | {step_cpu_ms(length, args.steps):.2f} | {os.getloadavg()[0]:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
