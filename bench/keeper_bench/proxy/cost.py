"""What the keeper proxy costs: added latency, CPU and memory against an instant upstream.

    python -m keeper_bench.proxy.cost --out runs/proxy-bench

The proxy runs in its own process (so its CPU time and memory are its own, read from ``/proc``;
Linux only) in front of an upstream that answers at once: ``NO CHANGES`` to note requests, a
short line to everything else. Agents send their whole history on every call, as an agent that
manages nothing does, so the proxy's per-call cost is measured at the request sizes it really
gets. The keeper's own work (cuts, notes, the archive index) is part of what is measured.

- **Latency**: 1 and 32 concurrent sessions, each replaying the same stream (one batch a call).
  Added latency per call is the agent's round trip minus the time the proxy spent waiting for
  the upstream (its ``upstream_seconds`` counter, read after each call).
- **Memory**: one session archives a long stream (several batches a call, to keep the number of
  calls down); the proxy's resident memory is sampled as the archived history grows.

The results table goes to ``bench/results/proxy_bench.md`` with ``--results``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from keeper_bench.proxy.heap import heap_by_history
from keeper_bench.proxy.servers import (
    ProxyProcess,
    proxy_process,
    serve_proxy,
    serve_upstream,
    upstream_process,
)
from keeper_bench.proxy.turns import agent_turns
from keeper_bench.run_options import resolve_stream
from keeper_bench.steps import SYSTEM_PROMPT
from keeper_bench.streams import (
    SIZES,
    StreamSpec,
    generate_stream,
    load_spec,
    preset_spec,
)


# -- agents -------------------------------------------------------------------------------------
def memory_stream(size: str, folder: Path) -> Path:
    """A rules+overdrawn stream of a preset size, or of ``size`` tokens (e.g. ``3000000``)."""
    families = frozenset({"base", "rules", "overdrawn"})
    if size in SIZES:
        spec = preset_spec(size, families=families)
    elif size.isdigit():
        base = preset_spec("1m", families=families).to_json()
        spec = StreamSpec.from_json({**base, "target_tokens": int(size)})
    else:
        raise ValueError(f"stream size {size!r}: use one of {', '.join(SIZES)} or a token count")
    if not ((folder / "stream.jsonl").exists() and load_spec(folder) == spec):
        generate_stream(spec, folder)
    return folder


@dataclass(slots=True)
class SessionTrace:
    latencies: list[float]
    added: list[float]
    """The agent's round trip minus the proxy's upstream wait."""
    proxy_added: list[float]
    """The proxy's own ``added_seconds`` per call (from reading the body to the reply)."""
    history_tokens: list[int]
    memory: list[tuple[int, float, float]]
    """(history tokens, proxy RSS in MB, this call's body in MB) as the history grows."""


async def drive_session(
    client: httpx.AsyncClient,
    proxy: ProxyProcess,
    session: str,
    turns: Sequence[Sequence[str]],
    *,
    sample_every_tokens: int = 0,
) -> SessionTrace:
    """One agent that resends its whole history every call (JSON encoded off the event loop)."""
    history: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}]
    trace = SessionTrace([], [], [], [], [])
    headers = {"x-keeper-session": session, "content-type": "application/json"}
    chars, waited, own, next_sample = 0, 0.0, 0.0, sample_every_tokens
    for turn in turns:
        history += [{"role": "user", "content": text} for text in turn]
        chars += sum(map(len, turn))
        body = await asyncio.to_thread(json.dumps, {"model": "instant", "messages": history})
        started = time.perf_counter()
        response = await client.post("/v1/chat/completions", content=body, headers=headers)
        elapsed = time.perf_counter() - started
        response.raise_for_status()
        reply = response.json()["choices"][0]["message"]
        history.append({"role": "assistant", "content": reply["content"]})
        report = (await client.get(f"/keeper/sessions/{session}")).json()
        upstream = float(report["proxy"]["upstream_seconds"])
        added = float(report["proxy"]["added_seconds"])
        trace.latencies.append(elapsed)
        trace.added.append(max(0.0, elapsed - (upstream - waited)))
        trace.proxy_added.append(added - own)
        trace.history_tokens.append(chars // 4)
        waited, own = upstream, added
        if sample_every_tokens and chars // 4 >= next_sample:
            trace.memory.append((chars // 4, proxy.memory_mb()[0], len(body) / 1e6))
            next_sample += sample_every_tokens
    return trace


def _percentile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


@dataclass(frozen=True, slots=True)
class Measured:
    label: str
    sessions: int
    calls: int
    p50_ms: float
    p99_ms: float
    own_p50_ms: float
    own_p99_ms: float
    added_total_s: float
    cpu_s: float
    wall_s: float
    rss_mb: float
    peak_mb: float
    memory: tuple[tuple[int, float, float], ...] = ()

    def row(self) -> str:
        share = self.cpu_s / self.wall_s if self.wall_s else 0.0
        return (
            f"| {self.label} | {self.sessions} | {self.calls:,} | {self.p50_ms:.1f} | "
            f"{self.p99_ms:.1f} | {self.own_p50_ms:.1f} | {self.own_p99_ms:.1f} | "
            f"{self.added_total_s:.1f} | {self.cpu_s:.1f} | "
            f"{1000 * self.cpu_s / max(1, self.calls):.1f} | {share:.0%} | {self.wall_s:.1f} | "
            f"{self.rss_mb:.0f} / {self.peak_mb:.0f} |"
        )


async def _drive_all(
    proxy: ProxyProcess, turns: list[list[str]], sessions: int, sample_every: int
) -> list[SessionTrace]:
    limits = httpx.Limits(max_connections=sessions + 1)
    async with httpx.AsyncClient(base_url=proxy.url, timeout=900, limits=limits) as client:
        jobs = [
            drive_session(client, proxy, f"bench-{n}", turns, sample_every_tokens=sample_every)
            for n in range(sessions)
        ]
        return list(await asyncio.gather(*jobs))


def measure(
    label: str,
    upstream: str,
    turns: list[list[str]],
    *,
    sessions: int,
    window: int,
    archive: Path,
    sample_every: int = 0,
) -> Measured:
    shutil.rmtree(archive, ignore_errors=True)  # a fresh archive: sessions must start empty
    with proxy_process(upstream, window, archive) as proxy:
        cpu_before, started = proxy.cpu_seconds(), time.perf_counter()
        traces = asyncio.run(_drive_all(proxy, turns, sessions, sample_every))
        wall, cpu = time.perf_counter() - started, proxy.cpu_seconds() - cpu_before
        rss, peak = proxy.memory_mb()
    added = [a for t in traces for a in t.added]
    own = [a for t in traces for a in t.proxy_added]
    return Measured(
        label=label,
        sessions=sessions,
        calls=len(added),
        p50_ms=1000 * statistics.median(added),
        p99_ms=1000 * _percentile(added, 0.99),
        own_p50_ms=1000 * statistics.median(own),
        own_p99_ms=1000 * _percentile(own, 0.99),
        added_total_s=sum(added),
        cpu_s=cpu,
        wall_s=wall,
        rss_mb=rss,
        peak_mb=peak,
        memory=tuple(m for t in traces for m in t.memory),
    )


NOTES = (
    "- *added*: seen by the agent, so it includes the agents' own queueing: all agents share one "
    "Python process and event loop, which dominates at 32 sessions. *proxy's own*: the proxy's "
    "`added_seconds` counter per call (from the parsed request to its reply, minus the upstream "
    "wait); reading and parsing the request body are outside it and inside *added*.",
    "- *proxy CPU*: the proxy process's CPU time (user + system, from `/proc`) over the run.",
    "- Memory rows: one session; the agent's request is its whole history, parsed on every call, "
    "so the proxy's resident memory follows the largest request, not the archive (which is on "
    "disk, in SQLite).",
    "- Reproduce: `python -m keeper_bench.proxy.cost --memory-streams 1m,3000000,10m "
    "--results bench/results/proxy_bench.md` (about 5 minutes here).",
)


# -- the command --------------------------------------------------------------------------------
HEADER = (
    "| run | sessions | calls | added p50 (ms) | added p99 (ms) | proxy's own p50 (ms) "
    "| proxy's own p99 (ms) | added in total (s) | proxy CPU (s) | CPU per call (ms) "
    "| proxy CPU / wall | wall (s) | proxy RSS end / peak (MB) |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def results_markdown(
    rows: Sequence[Measured],
    window: int,
    notes: Sequence[str],
    heap: tuple[str, Sequence[tuple[int, float, float]]] | None = None,
) -> str:
    lines = [
        f"# Keeper proxy overhead (window {window:,} tokens, instant upstream)",
        "",
        "The proxy in its own process, an upstream that answers at once (`NO CHANGES` to note "
        "requests), agents that resend their whole history every call. Added = the agent's round "
        "trip minus the proxy's time waiting for the upstream; it includes the keeper's cuts and "
        "note-taking bookkeeping. On a 2-core machine shared by the agents, the upstream and "
        "the proxy.",
        "",
        HEADER,
        *(row.row() for row in rows),
    ]
    for row in rows:
        if row.memory:
            lines += [
                "",
                f"Proxy RSS by history, {row.label}:",
                "",
                "| history (tokens) | proxy RSS (MB) | that call's request (MB) |",
                "| --- | --- | --- |",
                *(f"| {t:,} | {mb:.0f} | {body:.1f} |" for t, mb, body in row.memory),
            ]
    if heap is not None:
        label, points = heap
        lines += [
            "",
            f"Python heap (`tracemalloc`; agent and proxy in one process), {label}: what stays "
            "allocated between calls (the proxy's state and the agent's list of messages; the "
            "stream's texts are not counted), and the peak so far, which is the agent encoding "
            "and the proxy parsing the largest request.",
            "",
            "| history (tokens) | kept between calls (MB) | peak (MB) |",
            "| --- | --- | --- |",
            *(f"| {t:,} | {kept:.1f} | {peak:.0f} |" for t, kept, peak in points),
        ]
    return "\n".join([*lines, "", *notes]) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Measure the keeper proxy's added cost.")
    parser.add_argument("--serve-proxy", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--serve-upstream", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--window", type=int, default=32_768)
    parser.add_argument("--out", type=Path, default=Path("runs/proxy-bench"))
    parser.add_argument("--latency-stream", default="small:rules+overdrawn")
    parser.add_argument(
        "--memory-streams",
        default="1m,3000000",
        help="stream sizes for the memory rows: presets or token counts (e.g. 1m,10m)",
    )
    parser.add_argument("--per-call", type=int, default=10, help="batches a call, memory rows")
    parser.add_argument(
        "--heap-stream", default="3000000", help="stream size for the heap table ('' for none)"
    )
    parser.add_argument("--results", type=Path, default=None, help="write the markdown table here")
    parser.add_argument(
        "--side-by-side",
        type=Path,
        default=None,
        help="only compare the proxy with the upstream called directly (see proxy_vs_direct); "
        "write the table here",
    )
    parser.add_argument(
        "--calls", type=int, default=60, help="calls per agent in the side-by-side comparison"
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="passes per side in the side-by-side comparison"
    )
    args = parser.parse_args(argv)
    if args.serve_proxy is not None:
        serve_proxy(args.serve_proxy)
        return 0
    if args.serve_upstream is not None:
        serve_upstream(args.serve_upstream)
        return 0
    if args.side_by_side is not None:
        from keeper_bench.proxy import vs_direct as proxy_vs_direct

        return proxy_vs_direct.main(
            [
                "--results",
                str(args.side_by_side),
                "--calls",
                str(args.calls),
                "--repeat",
                str(args.repeat),
                "--window",
                str(args.window),
                "--stream",
                args.latency_stream,
                "--out",
                str(args.out),
            ]
        )
    rows: list[Measured] = []
    with upstream_process() as upstream:
        stream = resolve_stream(args.latency_stream, args.out / "latency-stream")
        turns = agent_turns(stream, 1)
        for sessions in (1, 32):
            archive = args.out / f"latency-{sessions}"
            rows.append(
                measure(
                    f"{args.latency_stream}, 1 batch a call",
                    upstream,
                    turns,
                    sessions=sessions,
                    window=args.window,
                    archive=archive,
                )
            )
            _written(rows, args)
        for size in (s for s in args.memory_streams.split(",") if s):
            turns = agent_turns(memory_stream(size, args.out / f"stream-{size}"), args.per_call)
            total = sum(len(text) for turn in turns for text in turn) // 4
            rows.append(
                measure(
                    f"{size}, {args.per_call} batches a call",
                    upstream,
                    turns,
                    sessions=1,
                    window=args.window,
                    archive=args.out / f"memory-{size}",
                    sample_every=max(250_000, total // 8),
                )
            )
            _written(rows, args)
    heap = None
    if args.heap_stream:
        turns = agent_turns(
            memory_stream(args.heap_stream, args.out / f"stream-{args.heap_stream}"), args.per_call
        )
        total = sum(len(text) for turn in turns for text in turn) // 4
        points = heap_by_history(
            turns, window=args.window, archive=args.out / "heap", every=max(250_000, total // 6)
        )
        heap = (f"{args.heap_stream}, {args.per_call} batches a call", points)
    print(_written(rows, args, heap))
    return 0


def _written(
    rows: Sequence[Measured],
    args: argparse.Namespace,
    heap: tuple[str, Sequence[tuple[int, float, float]]] | None = None,
) -> str:
    """The table so far, rewritten after every row so a run cut short keeps what it measured."""
    print(rows[-1].row(), flush=True)
    table = results_markdown(rows, args.window, NOTES, heap)
    if args.results is not None:
        args.results.write_text(table, encoding="utf-8")
    return table


if __name__ == "__main__":
    sys.exit(main())
