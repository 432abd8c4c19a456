"""``keeper-bench proxy-overhead``: what ``keeper-proxy`` costs per request, beside a bare relay.

    keeper-bench proxy-overhead --results bench/results/proxy_overhead.md

Three ways to reach one upstream, measured side by side in one process tree: directly, through a
bare pass-through relay (:mod:`.relay`: the floor for any Python proxy on the same stack), and
through ``keeper-proxy`` (the real command, in its own process). Each runs at 1 and at 32
sessions at once, in front of an upstream that answers at once and one that takes 50 ms. Every
session resends its whole history on every call, as an agent that manages nothing does.

What load moves least is reported first: the CPU time each server process spent per request,
read from the process itself (``/proc/<pid>/task/*/schedstat``, Linux), not wall time. Throughput
and latency are reported beside it. The machine is shared, so the three ways are measured in
interleaved passes (direct, relay, proxy, direct, ...) and the table gives medians over
``--repeat`` passes with their range, and the load average around each row.

Tool results are not numbered inputs and the history stays inside the window, so no request
makes a cut (the *cuts* column checks it): the target, keeper-proxy's CPU per request at most
twice the relay's, is for requests without a cut.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from keeper_bench.proxy.growth import growth_header, growth_markdown, measure_growth
from keeper_bench.proxy.overhead_report import (
    HEADER,
    _commit,
    results_markdown,
)
from keeper_bench.proxy.servers import (
    READ_NEXT,
    ProxyProcess,
    keeper_proxy_process,
    keeping_process,
    pinned_servers,
    relay_process,
    upstream_server,
)
from keeper_bench.run_options import resolve_stream
from keeper_bench.steps import SYSTEM_PROMPT, plan_steps
from keeper_bench.streams import read_stream

__all__ = ["PATHS", "Pass", "Row", "main", "register_commands", "results_markdown"]

PATHS = ("direct", "relay", "floor", "keeping", "keeper-proxy")
LARGE_WINDOW = 4_194_304
"""keeper-proxy's window in tokens for the --large-window rows: nothing is cut."""


@dataclass(frozen=True, slots=True)
class Pass:
    """One path's pass: every session's calls, and the CPU each process spent on them."""

    wall_s: float
    latencies: tuple[float, ...]
    middle_cpu_s: float | None
    """The relay's or keeper-proxy's CPU seconds (None going direct)."""
    upstream_cpu_s: float
    cuts: int = 0

    @property
    def requests(self) -> int:
        return len(self.latencies)

    @property
    def rps(self) -> float:
        return self.requests / self.wall_s if self.wall_s else 0.0

    @property
    def p50_ms(self) -> float:
        return 1000 * statistics.median(self.latencies)

    @property
    def middle_ms(self) -> float | None:
        if self.middle_cpu_s is None:
            return None
        return 1000 * self.middle_cpu_s / max(1, self.requests)

    @property
    def upstream_ms(self) -> float:
        return 1000 * self.upstream_cpu_s / max(1, self.requests)


@dataclass(slots=True)
class Row:
    """One upstream and number of sessions: every path's passes, and the load around them."""

    upstream: str
    sessions: int
    passes: dict[str, list[Pass]] = field(default_factory=lambda: {p: [] for p in PATHS})
    load_before: float = 0.0
    load_after: float = 0.0

    def ratios(self, floor: str = "floor") -> list[float]:
        """keeper-proxy's CPU per request over the fair floor's (``floor="keeping"``: the
        keeping floor's), pass by pass; empty when that floor was not measured."""
        floors = self.passes[floor]
        if not floors:
            return []
        pairs = zip(floors, self.passes["keeper-proxy"], strict=True)
        return [p.middle_ms / r.middle_ms for r, p in pairs if r.middle_ms and p.middle_ms]

    def lines(self) -> list[str]:
        out = []
        for path in PATHS:
            passes = self.passes[path]
            if not passes:
                continue
            middle = [p.middle_ms for p in passes if p.middle_ms is not None]
            ratio = kept = ""
            if path == "keeper-proxy" and self.ratios():
                ratio = _spread(self.ratios(), "{:.2f}")
            if path == "keeper-proxy" and self.ratios("keeping"):
                kept = _spread(self.ratios("keeping"), "{:.2f}")
            out.append(
                f"| {self.upstream} | {self.sessions} | {path} | {passes[0].requests:,} | "
                f"{_spread([p.rps for p in passes], '{:.0f}')} | "
                f"{_spread([p.p50_ms for p in passes], '{:.1f}')} | "
                f"{_spread(middle, '{:.2f}') if middle else '–'} | "
                f"{_spread([p.upstream_ms for p in passes], '{:.2f}')} | {ratio or '–'} | "
                f"{kept or '–'} | "
                f"{sum(p.cuts for p in passes) if path == 'keeper-proxy' else '–'} | "
                f"{self.load_before:.1f} → {self.load_after:.1f} |"
            )
        return out


def _spread(values: Sequence[float], form: str) -> str:
    """The median, and the range when there are several values."""
    middle = form.format(statistics.median(values))
    if len(values) < 2:
        return middle
    return f"{middle} ({form.format(min(values))}–{form.format(max(values))})"


# -- the agents ---------------------------------------------------------------------------------
READ_NEXT_TOOL = {
    "type": "function",
    "function": {
        "name": READ_NEXT,
        "description": "Read the next part of the record.",
        "parameters": {"type": "object", "properties": {}},
    },
}


def agent_inputs(stream: Path, calls: int) -> list[str]:
    """The task, then what each call's tool result reads: one stream message a call."""
    messages = [step.message for step in plan_steps(read_stream(stream), "messages")]
    return messages[: calls + 1]


async def drive(url: str, inputs: Sequence[str], sessions: int, tag: str) -> Pass:
    """``sessions`` agents at once, each in its tool loop (the model calls ``read_next``, the
    agent appends the call and its result) and resending its whole history on every call.
    Tool results are not numbered inputs, so the keeper's cadence makes no cut; only the window
    could. The agents use aiohttp, a client cheap enough not to cap the direct path."""
    import aiohttp

    async def one(client: aiohttp.ClientSession, number: int) -> list[float]:
        history: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": inputs[0]},
        ]
        headers = {"x-keeper-session": f"{tag}-{number}", "content-type": "application/json"}
        times = []
        for text in inputs[1:]:
            body = orjson.dumps(
                {"model": "instant", "messages": history, "tools": [READ_NEXT_TOOL]}
            )
            started = time.perf_counter()
            async with client.post(f"{url}/v1/chat/completions", data=body, headers=headers) as got:
                data = await got.read()
                if got.status != 200:
                    raise RuntimeError(f"{url} answered {got.status}: {data[:300]!r}")
            times.append(time.perf_counter() - started)
            reply = orjson.loads(data)["choices"][0]["message"]
            history.append(reply)
            for call in reply.get("tool_calls") or []:
                history.append({"role": "tool", "tool_call_id": call["id"], "content": text})
            if not reply.get("tool_calls"):
                history.append({"role": "user", "content": text})
        return times

    connector = aiohttp.TCPConnector(limit=sessions + 1)
    async with aiohttp.ClientSession(connector=connector) as client:
        started = time.perf_counter()
        runs = await asyncio.gather(*(one(client, n) for n in range(sessions)))
        wall = time.perf_counter() - started
    return Pass(wall, tuple(t for run in runs for t in run), None, 0.0)


def _cuts(url: str, tag: str, sessions: int) -> int:
    import httpx

    with httpx.Client(base_url=url, timeout=60) as client:
        reports = [client.get(f"/keeper/sessions/{tag}-{n}").json() for n in range(sessions)]
    return sum(int(r["counters"].get("cuts", 0)) for r in reports)


def timed_pass(
    url: str,
    calls: Sequence[str],
    sessions: int,
    tag: str,
    upstream: ProxyProcess,
    middle: ProxyProcess | None,
) -> Pass:
    """One pass with the CPU of the upstream and of the process in the middle read around it."""
    up_before = upstream.cpu_seconds()
    middle_before = middle.cpu_seconds() if middle is not None else 0.0
    result = asyncio.run(drive(url, calls, sessions, tag))
    middle_cpu = middle.cpu_seconds() - middle_before if middle is not None else None
    return Pass(
        result.wall_s,
        result.latencies,
        middle_cpu,
        upstream.cpu_seconds() - up_before,
    )


def measure_upstream(
    delay: float,
    calls: Sequence[str],
    *,
    sessions: Sequence[int],
    repeat: int,
    window: int,
    archive: Path,
    keeping: bool = True,
    report: Callable[[str], None] = print,
) -> list[Row]:
    """Every number of sessions in front of one upstream, in interleaved passes (``keeping``:
    the keeping floor among them); each path is warmed by a short pass first, so that start-up
    and lazy imports are not measured."""
    label = "instant" if not delay else f"{delay * 1000:.0f} ms"
    rows: list[Row] = []
    with ExitStack() as stack:
        upstream = stack.enter_context(upstream_server(delay))
        relay = stack.enter_context(relay_process(upstream))
        floor = stack.enter_context(relay_process(upstream, archive.with_name("floor.sqlite")))
        middles: dict[str, ProxyProcess | None] = {"direct": None, "relay": relay, "floor": floor}
        if keeping:
            rows_file = archive.with_name("keeping.sqlite")
            middles["keeping"] = stack.enter_context(keeping_process(upstream, rows_file))
        proxy = stack.enter_context(keeper_proxy_process(upstream, window, archive))
        middles["keeper-proxy"] = proxy
        urls = {p: (m.url if m is not None else upstream.url) for p, m in middles.items()}
        for path in middles:
            asyncio.run(drive(urls[path], calls[:6], 2, f"warm-{path}"))
        for count in sessions:
            row = Row(label, count, load_before=os.getloadavg()[0])
            for number in range(repeat):
                for path in middles:
                    tag = f"{path}-{count}-{number}"
                    done = timed_pass(urls[path], calls, count, tag, upstream, middles[path])
                    if path == "keeper-proxy":
                        done = Pass(
                            done.wall_s,
                            done.latencies,
                            done.middle_cpu_s,
                            done.upstream_cpu_s,
                            _cuts(proxy.url, tag, count),
                        )
                    row.passes[path].append(done)
            row.load_after = os.getloadavg()[0]
            rows.append(row)
            for line in row.lines():
                report(line)
    return rows


# -- the command --------------------------------------------------------------------------------
def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results", type=Path, default=None, help="write the table here")
    parser.add_argument("--calls", type=int, default=60, help="calls each session makes a pass")
    parser.add_argument("--repeat", type=int, default=3, help="passes per path and row")
    parser.add_argument("--sessions", default="1,32", help="sessions at once, one row each")
    parser.add_argument(
        "--delays", default="0,0.05", help="the upstream's seconds to answer, one set of rows each"
    )
    parser.add_argument(
        "--window", type=int, default=32_768, help="keeper-proxy's window in tokens"
    )
    parser.add_argument(
        "--history",
        default="",
        help="also measure keeper-proxy's CPU a request at these numbers of messages in view "
        "(e.g. 20,200,1000), one row each",
    )
    parser.add_argument(
        "--history-only", action="store_true", help="measure only the --history rows"
    )
    parser.add_argument("--history-calls", type=int, default=20, help="measured calls a row")
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="a checkout of another version (git worktree add DIR COMMIT): its keeper-proxy is "
        "measured in the history rows too, interleaved with this one",
    )
    parser.add_argument("--history-sessions", type=int, default=1, help="sessions at once a row")
    parser.add_argument(
        "--history-window",
        type=int,
        default=None,
        help="keeper-proxy's window for the --history rows (default: --window)",
    )
    parser.add_argument(
        "--large-window",
        default="",
        help="also measure sessions whose live window holds these numbers of messages (e.g. "
        "1000,2000): the same rows with a window large enough that nothing is cut",
    )
    parser.add_argument(
        "--pin-cpu",
        type=int,
        default=None,
        help="keep every measured server (the relays, keeper-proxy, the baseline) on this CPU, "
        "as keeper-proxy --cpu does (default: wherever the OS puts them)",
    )
    parser.add_argument(
        "--no-keeping-floor",
        action="store_true",
        help="leave the keeping floor (relay --keeping) out of every table, for a shorter run",
    )
    parser.add_argument("--stream", default="small:rules+overdrawn")
    parser.add_argument("--out", type=Path, default=Path("runs/proxy-overhead"))


def run(args: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    if args.repeat < 1 or args.calls < 1:
        raise ValueError("--repeat and --calls must be at least 1")
    started = time.perf_counter()
    stream = resolve_stream(args.stream, args.out / "stream")
    calls = agent_inputs(stream, args.calls)
    counts = [int(n) for n in args.sessions.split(",") if n]
    lengths = [int(n) for n in args.history.split(",") if n]
    only_history = args.history_only and bool(lengths or args.large_window)
    with pinned_servers(args.pin_cpu):
        return _run(args, argv, started, stream, calls, counts, lengths, only_history)


def _run(
    args: argparse.Namespace,
    argv: Sequence[str] | None,
    started: float,
    stream: Path,
    calls: list[str],
    counts: list[int],
    lengths: list[int],
    only_history: bool,
) -> int:
    rows: list[Row] = []
    if not only_history:
        print(HEADER, flush=True)
    for delay in (float(d) for d in args.delays.split(",") if d and not only_history):
        rows += measure_upstream(
            delay,
            calls,
            sessions=counts,
            repeat=args.repeat,
            window=args.window,
            archive=args.out / "proxy",
            keeping=not args.no_keeping_floor,
            report=lambda line: print(line, flush=True),
        )
    growth: list[str] = []
    base_label = _commit(args.baseline) if args.baseline else None
    history_window = args.history_window or args.window
    large = [int(n) for n in args.large_window.split(",") if n]
    runs = [
        (lengths, history_window, "As the resent history grows"),
        (large, LARGE_WINDOW, "A live window of many small messages"),
    ]
    for sizes, window, title in runs:
        if not sizes:
            continue
        print(growth_header(base_label), flush=True)
        rows_of = measure_growth(
            agent_inputs(stream, 10_000),
            lengths=sizes,
            calls=args.history_calls,
            sessions=args.history_sessions,
            repeat=args.repeat,
            window=window,
            archive=args.out / "proxy-history",
            start_relay=relay_process,
            start_proxy=keeper_proxy_process,
            start_floor=relay_process,
            start_keeping=None if args.no_keeping_floor else keeping_process,
            baseline=args.baseline.resolve() if args.baseline else None,
            report=lambda line: print(line, flush=True),
        )
        growth += growth_markdown(
            rows_of, calls=args.history_calls, window=window, baseline=base_label, title=title
        )
    given = list(argv) if argv is not None else sys.argv[1:]
    command = " ".join(["keeper-bench", *given]) if given else "keeper-bench proxy-overhead"
    label = f"{args.stream}, {args.calls} calls, one message a call in a tool result"
    table = results_markdown(
        rows,
        label=label,
        window=args.window,
        command=command,
        seconds=time.perf_counter() - started,
        growth=growth,
    )
    if args.results is not None:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(table, encoding="utf-8")
    print(table)
    return 0


def register_commands(register: Callable[[Any], None]) -> None:
    """Adds ``keeper-bench proxy-overhead``."""
    from keeper_bench.cli import Command

    register(
        Command(
            "proxy-overhead",
            "keeper-proxy's CPU a request beside a bare relay and the upstream direct",
            configure,
            run,
        )
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    configure(parser)
    return run(parser.parse_args(argv), ["proxy-overhead", *(argv or sys.argv[1:])])


if __name__ == "__main__":
    sys.exit(main())
