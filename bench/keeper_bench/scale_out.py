"""Several ``keeper-proxy`` replicas on one PostgreSQL database, with agents on random replicas.

    python -m keeper_bench.scale_out --sessions 64 --turns 8

For each replica count (1, 2, 3 by default) fresh ``keeper-proxy --archive-url`` processes start
on one database, in front of one instant upstream (its own process: it answers at once, and
echoes the session named in the last user message so cross-talk shows). ``--sessions`` agents
each send ``--turns`` turns, whole history every call as an agent that manages nothing does,
each call to a replica drawn at random. The window is small, so sessions are cut every few
turns on whichever replica gets them. The same agents also call the upstream directly in the
same run, and the table gives throughput and p50/p95 round trips for both; "added" is the
proxy's percentile minus the direct one.

With ``--kill`` (the scale-out test does this), one replica is SIGKILLed while it waits for a
note reply (in the middle of a cut) and started again on its port; calls it had in flight are
sent again to another replica, as a load balancer would. Afterwards every session is audited in
the database: each turn archived once, NOTES versions equal to the cuts counted, and no
session's text in another's archive or reply. The results go to ``bench/results/scale_out.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from keeper_bench.postgres_audit import audit, size_per_million
from keeper_bench.replicas import Replicas, free_port

RESULTS = Path(__file__).resolve().parents[1] / "results" / "scale_out.md"
NOTE_MARKERS = ("[NOTES REQUEST]", "[NOTES CHECK]")
TASK = "Task: keep the ledger of {tag}. Rule: answer with the session's name."
FILLER = "The lamps were lit early near the gate and nobody spoke for a while. " * 12


def tag_of(messages: list[dict[str, Any]]) -> str:
    """The session tag in the newest user message (the agents put it in every one)."""
    for message in reversed(messages):
        content = message.get("content")
        if message.get("role") == "user" and isinstance(content, str) and "[[" in content:
            return content.split("[[", 1)[1].split("]]", 1)[0]
    return "?"


def upstream_app(kill_after: int) -> Starlette:
    """The instant upstream. With ``kill_after`` >= 0, the first note request after that many
    calls is announced on stdout (``NOTE <session tag>``) and answered only after a pause, so
    the replica that sent it can be killed while it waits, in the middle of a cut."""
    state = {"calls": 0, "announced": False}

    async def chat(request: Request) -> Response:
        body = json.loads(await request.body())
        messages = body.get("messages") or [{}]
        last = messages[-1].get("content") or ""
        tag = tag_of(messages)
        state["calls"] += 1
        note = isinstance(last, str) and last.startswith(NOTE_MARKERS)
        if note and not state["announced"] and 0 <= kill_after <= state["calls"]:
            state["announced"] = True
            print(f"NOTE {tag}", flush=True)
            await asyncio.sleep(3.0)
        text = "NO CHANGES" if note else f"1. noted for [[{tag}]]"
        return JSONResponse(
            {
                "id": "instant",
                "object": "chat.completion",
                "created": 0,
                "model": "instant",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


@dataclass
class Upstream:
    """The upstream in its own process (so the agents' load does not slow it), and the replica
    to kill when it announces a note request."""

    routes: dict[str, int] = field(default_factory=dict)
    """session tag -> replica its current request went to"""
    killed: int | None = None


@dataclass
class Traffic:
    rounds: list[float] = field(default_factory=list)
    resent: int = 0
    errors: list[str] = field(default_factory=list)
    crossed: list[str] = field(default_factory=list)


async def agent(
    client: httpx.AsyncClient,
    tag: str,
    turns: int,
    targets: list[str] | None,
    upstream: Upstream | None,
    replicas: Replicas | None,
    traffic: Traffic,
    rng: random.Random,
) -> None:
    """One agent: whole history every call; ``targets`` None means the upstream directly."""
    history: list[dict[str, Any]] = [{"role": "user", "content": TASK.format(tag=f"[[{tag}]]")}]
    for turn in range(1, turns + 1):
        history.append(
            {
                "role": "user",
                "content": f"Item {turn} for [[{tag}]]. The clerk recorded {tag}x{turn} at {turn}. {FILLER}",
            }
        )
        body = {"model": "instant", "messages": history}
        headers = {"x-keeper-session": tag}
        while True:
            number = 0
            if targets is not None:
                live = [
                    n for n in range(len(targets)) if replicas is None or n not in replicas.down
                ]
                number = rng.choice(live or [0])
                if upstream is not None:
                    upstream.routes[tag] = number
            url = (targets[number] if targets else "") + "/v1/chat/completions"
            started = time.perf_counter()
            try:
                response = await client.post(url, json=body, headers=headers)
            except httpx.TransportError:
                traffic.resent += 1  # the replica died under this call: a balancer resends
                await asyncio.sleep(0.2)
                continue
            elapsed = time.perf_counter() - started
            if response.status_code >= 500 and replicas is not None and number in replicas.down:
                traffic.resent += 1
                continue
            break
        if response.status_code != 200:
            traffic.errors.append(
                f"{tag} turn {turn}: {response.status_code} {response.text[:200]}"
            )
            return
        traffic.rounds.append(elapsed)
        reply = response.json()["choices"][0]["message"]["content"]
        if f"[[{tag}]]" not in reply:
            traffic.crossed.append(f"{tag} got {reply[:80]!r}")
        history.append({"role": "assistant", "content": reply})


async def drive(
    tags: list[str],
    turns: int,
    targets: list[str] | None,
    upstream_url: str,
    upstream: Upstream | None = None,
    replicas: Replicas | None = None,
) -> tuple[Traffic, float]:
    traffic = Traffic()
    limits = httpx.Limits(max_connections=len(tags) + 4)
    base = None if targets else upstream_url.removesuffix("/v1")
    async with httpx.AsyncClient(base_url=base or "", timeout=300, limits=limits) as client:
        started = time.perf_counter()
        await asyncio.gather(
            *(
                agent(client, tag, turns, targets, upstream, replicas, traffic, random.Random(tag))
                for tag in tags
            )
        )
        return traffic, time.perf_counter() - started


def _pct(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))] * 1000


@contextmanager
def upstream_process(kill_after: int, on_note: Any) -> Iterator[str]:
    """The upstream as a child process; ``on_note(tag)`` runs when it announces a note request."""
    port = free_port()
    command = [sys.executable, "-m", __spec__.name, "--serve-upstream", str(port), str(kill_after)]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def listen() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            if line.startswith("NOTE "):
                on_note(line.split(" ", 1)[1].strip())

    threading.Thread(target=listen, daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.post(f"{url}/v1/chat/completions", json={"messages": []}, timeout=2)
                break
            except httpx.TransportError:
                if child.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the upstream did not start") from None
                time.sleep(0.1)
        yield f"{url}/v1"
    finally:
        child.terminate()
        child.wait(timeout=30)


def run(
    database: str,
    *,
    replicas: int,
    sessions: int,
    turns: int,
    window: int = 2048,
    kill: bool = False,
    direct: bool = True,
) -> dict[str, Any]:
    """One scenario on a fresh schema of ``database``; returns the measurements and the audit."""
    import psycopg
    from psycopg import sql

    schema = f"scale_{replicas}_{os.getpid()}_{int(time.time() * 1000) % 10**8}"
    url = f"{database}{'&' if '?' in database else '?'}schema={schema}"
    tags = [f"s{n:03d}" for n in range(sessions)]
    upstream = Upstream()
    group: Replicas | None = None

    restarted = threading.Event()
    restart_failures: list[BaseException] = []

    def kill_and_restart(tag: str) -> None:
        """Kill the replica serving ``tag`` (it waits for a note reply: mid-cut), restart it.
        Runs on the thread that reads the upstream's notes: a failure is kept for ``run`` to
        raise, since an exception on that thread would reach no one."""
        assert group is not None
        try:
            number = upstream.killed = upstream.routes.get(tag, 0)
            group.kill(number)
            time.sleep(1.0)
            group.start(number)
        except BaseException as failure:
            restart_failures.append(failure)
        finally:
            restarted.set()

    kill_after = sessions * turns // 3 if kill else -1
    try:
        with upstream_process(kill_after, kill_and_restart) as upstream_url:
            group = Replicas(replicas, upstream_url, url, window)
            for number in range(replicas):
                group.start(number)
            traffic, wall = asyncio.run(
                drive(tags, turns, group.urls(), upstream_url, upstream, group)
            )
            if upstream.killed is not None:  # the killed replica must be back before the audit
                if not restarted.wait(timeout=300):
                    raise RuntimeError("the killed replica was not restarted within 300 s")
                if restart_failures:
                    raise RuntimeError("the killed replica did not restart") from (
                        restart_failures[0]
                    )
            direct_traffic, direct_wall = (
                asyncio.run(drive([f"d{t}" for t in tags], turns, None, upstream_url))
                if direct
                else (Traffic(), 0.0)
            )
        if traffic.errors or traffic.crossed:
            raise AssertionError(f"errors: {traffic.errors[:5]} cross-talk: {traffic.crossed[:5]}")
        checked = audit(url, tags, turns)
    finally:
        if group is not None:
            group.stop()
        with psycopg.connect(database, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    return {
        "replicas": replicas,
        "sessions": sessions,
        "calls": len(traffic.rounds),
        "throughput": len(traffic.rounds) / wall,
        "p50": _pct(traffic.rounds, 0.5),
        "p95": _pct(traffic.rounds, 0.95),
        "direct_throughput": len(direct_traffic.rounds) / direct_wall if direct_wall else 0.0,
        "direct_p50": _pct(direct_traffic.rounds, 0.5) if direct_traffic.rounds else 0.0,
        "direct_p95": _pct(direct_traffic.rounds, 0.95) if direct_traffic.rounds else 0.0,
        "resent": traffic.resent,
        "killed": upstream.killed,
        **checked,
    }


def render(rows: list[dict[str, Any]], note: str) -> str:
    lines = [
        "# Proxy replicas on one PostgreSQL database",
        "",
        (__doc__ or "\n\n").split("\n\n", 2)[1].strip(),
        "",
        note,
        "",
        "| replicas | sessions | calls | calls/s | p50 (ms) | p95 (ms) | direct calls/s | direct p50 (ms) | direct p95 (ms) | added p50 (ms) | added p95 (ms) | cuts | NOTES versions | killed replica | calls resent | DB MB per 1M archived tokens |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        per_million = r["db_bytes"] / 2**20 / max(1, r["archived_tokens"]) * 1e6
        lines.append(
            f"| {r['replicas']} | {r['sessions']} | {r['calls']:,} | {r['throughput']:.1f} | "
            f"{r['p50']:.0f} | {r['p95']:.0f} | {r['direct_throughput']:.1f} | "
            f"{r['direct_p50']:.1f} | {r['direct_p95']:.1f} | {r['p50'] - r['direct_p50']:.0f} | "
            f"{r['p95'] - r['direct_p95']:.0f} | {r['cuts']} | {r['versions']} | "
            f"{'#' + str(r['killed']) if r['killed'] is not None else '-'} | {r['resent']} | "
            f"{per_million:,.0f} ({r['db_bytes'] / 2**20:.1f} MB / {r['archived_tokens']:,} tokens) |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--replicas", default="1,2,3")
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--window", type=int, default=2048)
    parser.add_argument("--kill", action="store_true", help="SIGKILL one replica mid-cut")
    parser.add_argument("--database", help="a postgresql:// URL (default: a throwaway server)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--serve-upstream", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_upstream:
        import uvicorn

        port, kill_after = (int(v) for v in args.serve_upstream)
        uvicorn.run(
            upstream_app(kill_after),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            access_log=False,
        )
        return
    from keeper_bench.postgres_keyword_bench import database

    rows = []
    started = time.perf_counter()
    with database(args.database) as url:
        for count in (int(n) for n in args.replicas.split(",")):
            rows.append(
                run(
                    url,
                    replicas=count,
                    sessions=args.sessions,
                    turns=args.turns,
                    window=args.window,
                    kill=args.kill and count > 1,
                )
            )
            print(render(rows[-1:], "").splitlines()[-1], flush=True)
        size = size_per_million(url)
    shown = " ".join(argv) if argv is not None else " ".join(sys.argv[1:])
    note = (
        f"Command: `python -m keeper_bench.scale_out {shown}` "
        f"({time.perf_counter() - started:.0f} s in all, on the shared 2-core machine while "
        "other jobs ran: absolute figures are pessimistic, compare rows within one run)."
    )
    per_million = size["bytes"] / 2**20 / size["tokens"] * 1e6
    note += (
        f"\n\nDatabase size per million archived tokens (archive and keyword index, 8 sessions, "
        f"{size['tokens']:,} tokens of counter stories written as cuts of 10 turns, chars/4): "
        f"**{per_million:,.0f} MB** ({size['bytes'] / 2**20:,.1f} MB in all). The last column "
        "of the table is the same ratio for the small scenario archives, where the fixed cost "
        "of empty tables and indexes dominates."
    )
    table = render(rows, note)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(table)
    print(table)


if __name__ == "__main__":
    main()
