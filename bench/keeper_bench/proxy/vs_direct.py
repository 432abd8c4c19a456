"""The keeper proxy side by side with its upstream called directly: the same agents, one run.

    python -m keeper_bench.proxy.vs_direct --results bench/results/proxy_vs_direct.md

An instant upstream (its own process) is called by the same agents first directly, then through
the keeper proxy (its own process), each agent resending its whole history every call. On a
shared machine wall-clock figures move with everyone else's load, so each side is measured in
``--repeat`` interleaved passes (direct, proxy, direct, proxy, ...) and the table gives medians,
and beside them what load moves least: the CPU time each process spent per call, read from
``/proc`` (Linux only). The instant upstream's own CPU per call is what answering one HTTP
request costs on this machine; the proxy answers one and makes one per call, plus its own work.
The 1-minute load average is recorded before and after each row.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from keeper_bench.proxy.servers import ProxyProcess, proxy_process, upstream_server
from keeper_bench.proxy.turns import agent_turns
from keeper_bench.run_options import resolve_stream
from keeper_bench.steps import SYSTEM_PROMPT

__all__ = ["Compared", "Pass", "compare", "main", "results_markdown"]


@dataclass(frozen=True, slots=True)
class Pass:
    """One side's pass: every agent's calls, timed, and the CPU each server process spent."""

    wall_s: float
    latencies: tuple[float, ...]
    upstream_cpu_s: float
    proxy_cpu_s: float | None
    """None for the direct side (no proxy in the way)."""
    cuts: int = 0
    """Cuts the keeper made during the pass (the proxy side)."""
    call_cpu: tuple[float, ...] = ()
    """CPU seconds the measured server spent on each call (one agent only: with several at
    once a call's CPU cannot be told from another's)."""

    @property
    def calls(self) -> int:
        return len(self.latencies)

    @property
    def rps(self) -> float:
        return self.calls / self.wall_s if self.wall_s else 0.0

    @property
    def p50_ms(self) -> float:
        return 1000 * statistics.median(self.latencies)


async def drive(
    url: str,
    turns: Sequence[Sequence[str]],
    sessions: int,
    tag: str,
    cpu: Callable[[], float] | None = None,
) -> Pass:
    """``sessions`` agents at once, each resending its whole history every call (sessions named
    after ``tag``, so every pass starts empty); nothing else is asked between calls. With one
    agent, ``cpu`` (a server's CPU seconds so far) is read around every call. The pass's CPU
    totals are filled in by the caller."""
    per_call: list[float] = []

    async def one(client: httpx.AsyncClient, n: int) -> list[float]:
        history: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}]
        headers = {"x-keeper-session": f"{tag}-{n}", "content-type": "application/json"}
        times = []
        for turn in turns:
            history += [{"role": "user", "content": text} for text in turn]
            body = json.dumps({"model": "instant", "messages": history})
            before = cpu() if cpu is not None and sessions == 1 else None
            started = time.perf_counter()
            response = await client.post("/v1/chat/completions", content=body, headers=headers)
            times.append(time.perf_counter() - started)
            if before is not None and cpu is not None:
                per_call.append(cpu() - before)
            response.raise_for_status()
            history.append(response.json()["choices"][0]["message"])
        return times

    limits = httpx.Limits(max_connections=sessions + 1)
    async with httpx.AsyncClient(base_url=url, timeout=900, limits=limits) as client:
        started = time.perf_counter()
        runs = await asyncio.gather(*(one(client, n) for n in range(sessions)))
        wall = time.perf_counter() - started
    return Pass(wall, tuple(t for run in runs for t in run), 0.0, None, call_cpu=tuple(per_call))


def _cuts(proxy: ProxyProcess, tag: str, sessions: int) -> int:
    total = 0
    with httpx.Client(base_url=proxy.url, timeout=60) as client:
        for n in range(sessions):
            report = client.get(f"/keeper/sessions/{tag}-{n}").json()
            total += int(report["counters"].get("cuts", 0))
    return total


def _timed(
    url: str,
    turns: Sequence[Sequence[str]],
    sessions: int,
    tag: str,
    upstream: ProxyProcess,
    proxy: ProxyProcess | None,
) -> Pass:
    up_before = upstream.cpu_seconds()
    proxy_before = proxy.cpu_seconds() if proxy is not None else 0.0
    measured = proxy if proxy is not None else upstream
    result = asyncio.run(drive(url, turns, sessions, tag, measured.cpu_seconds))
    up_cpu = upstream.cpu_seconds() - up_before
    if proxy is None:
        return replace(result, upstream_cpu_s=up_cpu)
    proxy_cpu = proxy.cpu_seconds() - proxy_before
    cuts = _cuts(proxy, tag, sessions)
    return replace(result, upstream_cpu_s=up_cpu, proxy_cpu_s=proxy_cpu, cuts=cuts)


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


@dataclass(frozen=True, slots=True)
class Compared:
    """Both sides at one number of sessions, ``repeat`` passes each, with the machine's load."""

    sessions: int
    direct: tuple[Pass, ...]
    proxied: tuple[Pass, ...]
    load_before: float
    load_after: float

    @property
    def kept(self) -> list[float]:
        """The proxy's throughput as a share of the direct one, pass by pass."""
        return [p.rps / d.rps for d, p in zip(self.direct, self.proxied, strict=True)]

    @property
    def added_ms(self) -> list[float]:
        """Proxy p50 minus direct p50, pass by pass."""
        return [p.p50_ms - d.p50_ms for d, p in zip(self.direct, self.proxied, strict=True)]

    @property
    def proxy_cpu_ms(self) -> list[float]:
        return [1000 * (p.proxy_cpu_s or 0.0) / max(1, p.calls) for p in self.proxied]

    @property
    def upstream_cpu_ms(self) -> list[float]:
        return [1000 * d.upstream_cpu_s / max(1, d.calls) for d in self.direct]

    def call_cpu_p50_ms(self) -> str:
        """The proxy's median CPU per call over every call of every pass (one agent only): the
        typical call, a call without a cut, where the mean also carries the cuts."""
        calls = [c for p in self.proxied for c in p.call_cpu]
        return f"{1000 * statistics.median(calls):.2f}" if calls else "–"

    def row(self) -> str:
        kept, added = self.kept, self.added_ms
        return (
            f"| {self.sessions} | {len(self.direct)} | {self.direct[0].calls:,} | "
            f"{_median([d.rps for d in self.direct]):.0f} | "
            f"{_median([p.rps for p in self.proxied]):.0f} | "
            f"{_median(kept):.0%} ({min(kept):.0%}–{max(kept):.0%}) | "
            f"{_median([d.p50_ms for d in self.direct]):.1f} | "
            f"{_median([p.p50_ms for p in self.proxied]):.1f} | "
            f"{_median(added):.1f} ({min(added):.1f}–{max(added):.1f}) | "
            f"{_median(self.upstream_cpu_ms):.2f} | "
            f"{_median(self.proxy_cpu_ms):.2f} ({min(self.proxy_cpu_ms):.2f}–"
            f"{max(self.proxy_cpu_ms):.2f}) | {self.call_cpu_p50_ms()} | "
            f"{sum(p.cuts for p in self.proxied)} | "
            f"{self.load_before:.1f} → {self.load_after:.1f} |"
        )


HEADER = (
    "| sessions | passes | calls per pass | direct (req/s) | through the proxy (req/s) | "
    "kept (range) | direct p50 (ms) | proxy p50 (ms) | added p50 (ms, range) | "
    "upstream CPU per call (ms) | proxy CPU per call (ms, range) | proxy CPU p50 per call "
    "(ms) | cuts | load avg |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def compare(
    upstream: ProxyProcess,
    turns: Sequence[Sequence[str]],
    *,
    sessions: int,
    repeat: int,
    window: int,
    archive: Path,
) -> Compared:
    """``repeat`` interleaved passes of each side; one proxy process (a fresh archive) for all,
    warmed by a short pass first so that lazy imports are not measured."""
    shutil.rmtree(archive, ignore_errors=True)
    load_before = os.getloadavg()[0]
    direct: list[Pass] = []
    proxied: list[Pass] = []
    with proxy_process(f"{upstream.url}/v1", window, archive) as proxy:
        asyncio.run(drive(proxy.url, turns[:3], 1, "warm"))
        for number in range(repeat):
            direct.append(_timed(upstream.url, turns, sessions, f"d{number}", upstream, None))
            proxied.append(_timed(proxy.url, turns, sessions, f"p{number}", upstream, proxy))
    return Compared(sessions, tuple(direct), tuple(proxied), load_before, os.getloadavg()[0])


def results_markdown(
    rows: Sequence[Compared], *, window: int, label: str, command: str, seconds: float
) -> str:
    cores = os.cpu_count() or 0
    return "\n".join(
        [
            f"# Keeper proxy against the upstream called directly (window {window:,} tokens)",
            "",
            f"The same agents ({label}, each resending its whole history every call, nothing "
            "else asked between calls) against an instant upstream directly and through the "
            "proxy in front of it, in interleaved passes of one run. The upstream and the proxy "
            "run in their own processes; the agents share one event loop in a third. Figures "
            "are medians over the passes, with the range where it matters.",
            "",
            HEADER,
            *(row.row() for row in rows),
            "",
            "- *kept*: the proxy's throughput as a share of the direct one (pass by pass). "
            "*added p50*: proxy p50 minus direct p50 (pass by pass).",
            "- *CPU per call*: the process's user + system time (from `/proc`) over a pass, "
            "divided by its calls. The upstream's figure is what answering one HTTP request "
            "costs here; the proxy answers one and makes one per call, besides its own work. "
            "CPU time moves much less with other jobs' load than wall-clock time does.",
            "- *proxy CPU p50 per call*: with one agent the proxy's CPU time is read around "
            "every call; the median over all calls is the typical call, one without a cut "
            "(the per-call mean beside it also carries the cuts' note calls and indexing).",
            "- *cuts*: cuts the keeper made during the proxy's passes (0: every call was the "
            "no-cut path).",
            f"- *load avg*: the 1-minute load average before and after the row, on {cores} cores.",
            "",
            f"Measured with `{command}` ({seconds / 60:.1f} minutes).",
            "",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="The keeper proxy side by side with its upstream called directly."
    )
    parser.add_argument("--results", type=Path, default=None, help="write the table here")
    parser.add_argument("--calls", type=int, default=60, help="calls per agent in a pass")
    parser.add_argument("--repeat", type=int, default=3, help="passes per side and row")
    parser.add_argument("--sessions", default="1,32", help="concurrent agents per row")
    parser.add_argument("--window", type=int, default=32_768)
    parser.add_argument("--stream", default="small:rules+overdrawn")
    parser.add_argument("--out", type=Path, default=Path("runs/proxy-bench"))
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.calls < 1:
        parser.error("--repeat and --calls must be at least 1")
    counts = [int(n) for n in args.sessions.split(",") if n]
    started = time.perf_counter()
    stream = resolve_stream(args.stream, args.out / "latency-stream")
    turns = agent_turns(stream, 1)[: args.calls]
    rows: list[Compared] = []
    with upstream_server() as upstream:
        for sessions in counts:
            rows.append(
                compare(
                    upstream,
                    turns,
                    sessions=sessions,
                    repeat=args.repeat,
                    window=args.window,
                    archive=args.out / f"side-{sessions}",
                )
            )
            print(rows[-1].row(), flush=True)
    given = list(argv) if argv is not None else sys.argv[1:]
    command = " ".join(["python -m keeper_bench.proxy.vs_direct", *given])
    label = f"{args.stream}, first {len(turns)} calls, 1 batch a call"
    table = results_markdown(
        rows,
        window=args.window,
        label=label,
        command=command,
        seconds=time.perf_counter() - started,
    )
    if args.results is not None:
        args.results.write_text(table, encoding="utf-8")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
