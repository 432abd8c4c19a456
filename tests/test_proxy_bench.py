"""The proxy benchmarks' drivers on a tiny stream: an agent that manages nothing, graded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage

from keeper_bench.cli import grade_run
from keeper_bench.proxy.cost import HEADER, agent_turns, measure, memory_stream
from keeper_bench.proxy.servers import instant_reply, upstream_process
from keeper_bench.proxy.stream_run import (
    UpstreamMeter,
    results_markdown,
    run_through_proxy,
)
from keeper_bench.run_options import resolve_stream
from keeper_middleware.integrations.proxy.conversation.chat_messages import message_from_openai
from keeper_middleware.integrations.proxy.conversation.chat_request import parse_chat_request
from keeper_middleware.integrations.proxy.conversation.digests import message_key
from keeper_middleware.integrations.proxy.sessions.records import (
    RECORD_KEY,
    TAKEN_CHUNK,
    WINDOW_CHUNK,
    SessionRecord,
    StoredRecord,
)
from keeper_middleware.tokens.counting import ApproximateTokenCounter

WINDOW = 4096


@pytest.fixture(scope="module")
def tiny_stream(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("stream")
    return resolve_stream("tiny:rules+overdrawn", folder)


@pytest.fixture(scope="module")
def proxy_run(tiny_stream: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("proxy-run")
    run_through_proxy(tiny_stream, run_dir, window=WINDOW)
    return run_dir


def test_the_upstream_never_receives_more_than_the_window(proxy_run: Path) -> None:
    report = json.loads((proxy_run / "proxy.json").read_text())
    assert report["upstream"]["requests"] == report["session"]["proxy"]["upstream_calls"]
    assert 0 < report["upstream"]["largest_request_tokens"] <= WINDOW
    assert report["largest_agent_request_bytes"] > report["upstream"]["largest_request_bytes"]


def test_the_run_folder_grades_and_audits_like_any_other(proxy_run: Path) -> None:
    run = json.loads((proxy_run / "run.json").read_text())
    assert run["reader"] == "simulated reader"
    grade = grade_run(proxy_run)
    assert grade.asked > 0
    assert grade.right == grade.asked
    notes = [json.loads(line) for line in (proxy_run / "notes.jsonl").read_text().splitlines()]
    assert notes and {"version", "first_item", "last_item", "text"} <= set(notes[0])
    assert (proxy_run / "audit.json").exists()
    assert "keeper_proxy_requests_total" in (proxy_run / "metrics.txt").read_text()


def test_the_results_table_names_the_reader_and_the_window_check(proxy_run: Path) -> None:
    from keeper_bench.proxy.stream_run import ProxyRunResult

    result = ProxyRunResult(
        proxy_run, grade_run(proxy_run), json.loads((proxy_run / "proxy.json").read_text())
    )
    table = results_markdown(result, "tiny", None)
    assert "simulated reader" in table
    assert "| within the window | yes |" in table


def test_a_second_run_into_the_same_folder_is_refused(proxy_run: Path, tiny_stream: Path) -> None:
    with pytest.raises(FileExistsError, match="another --out"):
        run_through_proxy(tiny_stream, proxy_run, window=WINDOW)


def test_the_meter_counts_what_it_can_read_and_passes_on_the_rest() -> None:
    async def nothing(scope: object, receive: object, send: object) -> None:
        return None

    meter = UpstreamMeter(app=nothing)
    text = "word " * 80
    meter.measure(json.dumps({"messages": [{"role": "user", "content": text}]}).encode())
    meter.measure(b"not json")
    assert meter.requests == 2
    expected = ApproximateTokenCounter().count_messages([HumanMessage(text)])
    assert meter.largest_tokens == expected
    assert meter.largest_bytes == len(b'{"messages": [{"role": "user", "content": "') + 400 + 4


def test_the_instant_upstream_answers_note_requests_with_no_changes() -> None:
    note = {"messages": [{"role": "user", "content": "[NOTES REQUEST] items 1-4"}]}
    work = {"messages": [{"role": "user", "content": "Questions: 1. who?"}]}
    assert instant_reply(note) == "NO CHANGES"
    assert instant_reply(work) != "NO CHANGES"


def test_agent_turns_group_the_stream_after_the_task(tiny_stream: Path) -> None:
    single = agent_turns(tiny_stream, 1)
    grouped = agent_turns(tiny_stream, 4)
    assert len(single[0]) == len(grouped[0]) == 1
    assert [m for turn in grouped for m in turn] == [m for turn in single for m in turn]
    assert all(len(turn) <= 4 for turn in grouped)


def test_a_memory_stream_takes_a_token_count(tmp_path: Path) -> None:
    folder = memory_stream("6000", tmp_path / "s")
    assert (folder / "stream.jsonl").exists()
    with pytest.raises(ValueError, match="token count"):
        memory_stream("big", tmp_path / "t")


def test_reused_fingerprints_equal_fresh_ones_and_follow_edits() -> None:
    raw = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    first = parse_chat_request({"messages": raw})
    pairs = first.digests_reusing(())
    assert [d for _, d in pairs] == list(first.digests)
    edited = parse_chat_request(
        {"messages": [raw[0], {"role": "assistant", "content": "B"}, raw[2]]}
    )
    reused = edited.digests_reusing(pairs)
    assert [d for _, d in reused] == list(edited.digests)
    assert reused[0] == pairs[0]
    assert reused[1][1] != pairs[1][1]


def test_messages_with_structured_fields_get_no_key() -> None:
    parts = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    assert message_key(parts) is None
    assert message_key({"role": "user", "content": "hi"}) == message_key(
        {"content": "hi", "role": "user"}
    )
    assert message_from_openai(parts).content == [{"type": "text", "text": "hi"}]


# -- the stored session record: fingerprints in chunks -------------------------------------------


_WINDOW = tuple(HumanMessage(f"hi {i}", id=f"m-{i}") for i in range(3 * WINDOW_CHUNK + 4))


def _record(count: int, shown: int = 1) -> SessionRecord:
    return SessionRecord(
        window=_WINDOW[:shown],
        keeper_state={"items": 1},
        taken=tuple((f"d{i}", f"m-{i}") for i in range(count)),
    )


def _load(values: dict[str, object]) -> StoredRecord:
    return StoredRecord.load(values[RECORD_KEY], values.get)


def test_a_stored_record_loads_back_as_saved() -> None:
    values: dict[str, object] = {}
    stored, writes, stale = StoredRecord(SessionRecord()).saved(_record(2 * TAKEN_CHUNK + 5))
    values.update(writes)
    assert list(writes)[-1] == RECORD_KEY
    assert stale == []
    assert _load(values).record == stored.record == _record(2 * TAKEN_CHUNK + 5)


def test_a_save_after_new_messages_writes_only_them() -> None:
    first, writes, _ = StoredRecord(SessionRecord()).saved(_record(2 * TAKEN_CHUNK + 5))
    values: dict[str, object] = dict(writes)
    _, writes, stale = first.saved(_record(2 * TAKEN_CHUNK + 9))
    values.update(writes)
    assert list(writes)[-1] == RECORD_KEY
    new = [[f"d{i}", f"m-{i}"] for i in range(2 * TAKEN_CHUNK + 5, 2 * TAKEN_CHUNK + 9)]
    assert list(writes.values())[:-1] == [{"taken": new}]  # one piece, then the head
    assert stale == []
    assert _load(values).record == _record(2 * TAKEN_CHUNK + 9)


def test_new_window_messages_join_the_smaller_piece_before_them() -> None:
    first, writes, _ = StoredRecord(SessionRecord()).saved(_record(5, 3 * WINDOW_CHUNK + 1))
    values: dict[str, object] = dict(writes)
    second, writes, stale = first.saved(_record(5, 3 * WINDOW_CHUNK + 4))
    values.update(writes)
    assert len(writes[f"{RECORD_KEY}.pieces.2"]["window"]) == 4  # one, joined by three new
    assert second.lists["window"].pieces == ((4, 2),)
    assert stale == []  # the first save's pieces value still holds the fingerprints' piece
    assert _load(values).record == _record(5, 3 * WINDOW_CHUNK + 4)


def test_a_save_cut_short_before_its_head_leaves_the_previous_record() -> None:
    first, writes, _ = StoredRecord(SessionRecord()).saved(_record(TAKEN_CHUNK + 1))
    values: dict[str, object] = dict(writes)
    _, writes, _ = first.saved(_record(TAKEN_CHUNK + 3))
    values.update({k: v for k, v in writes.items() if k != RECORD_KEY})
    assert _load(values).record == _record(TAKEN_CHUNK + 1)


def _nothing(key: str) -> object:
    return None


def test_a_record_with_its_fingerprints_inline_still_loads() -> None:
    inline = _record(3).to_json()
    assert StoredRecord.load(inline, _nothing).record == _record(3)


def test_a_missing_chunk_is_reported_not_read_as_empty() -> None:
    _, writes, _ = StoredRecord(SessionRecord()).saved(_record(3))
    with pytest.raises(ValueError, match="restore the archive"):
        StoredRecord.load(writes[RECORD_KEY], _nothing)


@pytest.mark.slow
def test_the_overhead_benchmark_measures_a_proxy_process(tiny_stream: Path, tmp_path: Path) -> None:
    turns = agent_turns(tiny_stream, 1)[:6]
    with upstream_process() as upstream:
        row = measure(
            "tiny", upstream, turns, sessions=2, window=WINDOW, archive=tmp_path / "archive"
        )
    assert row.calls == 2 * len(turns)
    assert row.cpu_s > 0
    assert row.p99_ms >= row.p50_ms > 0
    assert row.rss_mb > 0
    assert row.row().count("|") == HEADER.splitlines()[0].count("|")


def test_the_side_by_side_row_pairs_passes_and_fills_every_column() -> None:
    from keeper_bench.proxy.vs_direct import HEADER as SIDE_HEADER
    from keeper_bench.proxy.vs_direct import Compared, Pass

    direct = (Pass(1.0, (0.001,) * 100, 0.05, None), Pass(2.0, (0.002,) * 100, 0.05, None))
    proxied = (
        Pass(2.0, (0.004,) * 100, 0.05, 0.3, cuts=1, call_cpu=(0.002,) * 100),
        Pass(2.0, (0.005,) * 100, 0.05, 0.2, call_cpu=(0.001,) * 100),
    )
    row = Compared(1, direct, proxied, 1.0, 2.0)
    assert row.kept == [0.5, 1.0]
    assert [round(a, 6) for a in row.added_ms] == [3.0, 3.0]
    assert [round(c, 6) for c in row.proxy_cpu_ms] == [3.0, 2.0]
    assert row.call_cpu_p50_ms() == "1.50"
    assert row.row().count("|") == SIDE_HEADER.splitlines()[0].count("|")


@pytest.mark.slow
def test_proxy_overhead_measures_the_three_paths_side_by_side(tmp_path: Path) -> None:
    from keeper_bench.cli import main as bench_main

    results = tmp_path / "proxy_overhead.md"
    code = bench_main(
        [
            "proxy-overhead",
            "--repeat",
            "1",
            "--calls",
            "4",
            "--sessions",
            "2",
            "--delays",
            "0",
            "--stream",
            "tiny:rules",
            "--out",
            str(tmp_path / "run"),
            "--results",
            str(results),
        ]
    )
    table = results.read_text()
    rows = [line for line in table.splitlines() if line.startswith("| instant |")]
    assert code == 0
    assert [row.split(" | ")[2] for row in rows] == [
        "direct",
        "relay",
        "floor",
        "keeping",
        "keeper-proxy",
    ]
    relay, floor, keeping, proxy = (row.split(" | ") for row in rows[1:])
    for cells in (relay, floor, keeping, proxy):  # CPU a request, read from each process
        assert float(cells[6].split()[0]) > 0
    by_floor, by_keeping = float(proxy[8].split()[0]), float(proxy[9].split()[0])
    proxy_ms = float(proxy[6].split()[0])
    assert by_floor == pytest.approx(proxy_ms / float(floor[6].split()[0]), rel=0.05)
    assert by_keeping == pytest.approx(proxy_ms / float(keeping[6].split()[0]), rel=0.05)
    assert proxy[10] == "0"  # the agents' tool loop makes no cut
    assert "the fair floor's CPU a request" in table and "Measured at commit" in table
    assert "the keeping floor's CPU a request" in table


@pytest.mark.slow
def test_proxy_overhead_measures_the_cpu_a_request_as_the_history_grows(tmp_path: Path) -> None:
    """``--history`` and ``--large-window``: a row per number of messages resent (and per number
    held in view), keeper-proxy beside the relay, the fair floor and another checkout's
    keeper-proxy (here this one's), and no main table with ``--history-only``."""
    from keeper_bench.cli import main as bench_main
    from keeper_bench.proxy.growth import starting_history

    assert len(starting_history(["task", "a", "b"], 12)) == 12
    results = tmp_path / "proxy_overhead.md"
    checkout = Path(__file__).resolve().parent.parent
    code = bench_main(
        [
            "proxy-overhead",
            *("--history", "6,12", "--history-only", "--history-calls", "2", "--repeat", "1"),
            *(
                "--large-window",
                "12",
            ),
            *("--stream", "tiny:rules", "--baseline", str(checkout)),
            *("--out", str(tmp_path / "run"), "--results", str(results)),
        ]
    )
    table = results.read_text()
    assert code == 0
    assert "| instant |" not in table
    rows = [  # the growth rows (the tables of where the CPU went split each cell with " / ")
        line.split(" | ")
        for line in table.splitlines()
        if line.startswith(("| 6 |", "| 12 |")) and " / " not in line
    ]
    assert [row[0] for row in rows] == ["| 6", "| 12", "| 12"]
    for row in rows:
        relay, floor, keeping, proxy, baseline = (float(cell.split()[0]) for cell in row[2:7])
        assert min(relay, floor, keeping, proxy, baseline) > 0  # each read from its own process
        by_floor, by_keeping = (float(cell.split()[0]) for cell in row[8:10])
        assert by_floor == pytest.approx(proxy / floor, rel=0.05)
        assert by_keeping == pytest.approx(proxy / keeping, rel=0.05)
    assert "keeper-proxy at " in table and "As the resent history grows" in table
    assert "A live window of many small messages" in table and "fair floor's CPU" in table
    assert "keeping floor's CPU a request" in table
    assert "Where each path's CPU a request went" in table
    split = [line for line in table.splitlines() if line.startswith("| 12 |") and " / " in line]
    assert split and all(cell.count(" / ") == 1 for cell in split[0].split(" | ")[1:])


def test_the_two_keeper_proxies_trade_places_from_pass_to_pass() -> None:
    """Whichever process runs later in a pass reads lower, so this checkout and the baseline
    alternate; the relay and the floor keep their places, and without a baseline nothing moves."""
    from keeper_bench.proxy.growth import pass_order

    paths = ["relay", "floor", "keeper-proxy", "baseline"]
    orders = [pass_order(paths, number) for number in range(4)]
    assert orders[0] == orders[2] == paths
    assert orders[1] == orders[3] == ["relay", "floor", "baseline", "keeper-proxy"]
    late = [order.index("keeper-proxy") > order.index("baseline") for order in orders]
    assert late.count(True) == late.count(False)
    assert pass_order(paths[:3], 1) == paths[:3]


@pytest.mark.parametrize("floor", ["bare", "fair", "keeping"])
def test_the_bare_relay_passes_bodies_statuses_and_streams_through(
    floor: str, tmp_path: Path
) -> None:
    """The bare relay; the fair floor, which also commits one row per request; the keeping
    floor, which keeps each whole reply with its request's new turn (a stream passes through)."""
    import asyncio
    import sqlite3

    import httpx

    from keeper_bench.proxy.relay import relay_app
    from keeper_middleware.integrations.proxy.cli import serve_in_thread
    from tests.proxy_upstream import ScriptedUpstream, as_sse, text_reply
    from tests.test_proxy_socket import upstream_app

    upstream = ScriptedUpstream(script=[text_reply("plain"), httpx.Response(418, json={})])
    with serve_in_thread(upstream_app(upstream)) as upstream_url:
        base = upstream_url.removesuffix("/v1")
        rows = tmp_path / "floor.sqlite" if floor == "fair" else None
        turns = tmp_path / "keeping.sqlite" if floor == "keeping" else None
        with serve_in_thread(relay_app(base, rows, turns)) as relay_url:

            async def ask() -> list[httpx.Response]:
                async with httpx.AsyncClient(base_url=relay_url, timeout=10) as client:
                    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
                    plain = await client.post("/chat/completions", json=body)
                    refused = await client.post("/chat/completions", json=body)
                    streamed = await client.post("/chat/completions", json={**body, "stream": True})
                    return [plain, refused, streamed]

            plain, refused, streamed = asyncio.run(ask())
    assert plain.json()["choices"][0]["message"]["content"] == "plain"
    assert refused.status_code == 418
    assert streamed.headers["content-type"].startswith("text/event-stream")
    assert streamed.content == as_sse(upstream.default(upstream.requests[-1]))
    if rows is not None:
        with sqlite3.connect(rows) as kept:
            assert kept.execute("SELECT count(*), sum(messages) FROM requests").fetchone() == (3, 3)
    if turns is not None:
        with sqlite3.connect(turns) as kept:
            got = kept.execute("SELECT session, request, reply FROM turns ORDER BY id").fetchall()
        assert [json.loads(request)["content"] for _, request, _ in got] == ["hi", "hi"]
        assert json.loads(got[0][2])["content"] == "plain"
        assert json.loads(got[1][2]) is None  # the refusal's body holds no reply


def test_a_baseline_checkout_opens_the_archive_the_runner_emptied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative archive path names one folder for the runner and the checkout's process alike:
    an earlier run's sessions are gone, and nothing is opened inside the checkout."""
    from keeper_bench.proxy.overhead import keeper_proxy_process
    from keeper_bench.proxy.servers import upstream_server

    checkout = Path(__file__).resolve().parents[1]
    runner = tmp_path / "runner"
    (runner / "runs" / "arch").mkdir(parents=True)
    (runner / "runs" / "arch" / "from-an-earlier-run").write_text("stale", encoding="utf-8")
    monkeypatch.chdir(runner)
    relative = Path("runs") / "arch"
    with upstream_server() as upstream, keeper_proxy_process(upstream, 4096, relative, checkout):
        opened = sorted(p.name for p in (runner / "runs" / "arch").iterdir())
    assert "from-an-earlier-run" not in opened and opened  # emptied, then opened by the proxy
    assert not (checkout / "runs" / "arch").exists()


def test_a_growth_row_reads_keeper_proxy_against_each_floor_it_measured() -> None:
    """Each ratio comes from its own floor's passes; a floor left out reads as a dash, and the
    line keeps the header's columns either way."""
    from keeper_bench.proxy.growth import GrowthRow, growth_header

    row = GrowthRow(200, 1)
    row.cpu_ms.update(relay=[0.3, 0.3], floor=[0.5, 0.4], keeping=[1.0, 0.8])
    row.cpu_ms["keeper-proxy"] = [2.0, 2.0]
    row.p50_ms["keeper-proxy"] = [3.0, 3.0]
    assert row.ratios() == [4.0, 5.0]
    assert row.ratios("keeping") == [2.0, 2.5]
    cells = row.line().split(" | ")
    assert cells[7:9] == ["4.50 (4.00–5.00)", "2.25 (2.00–2.50)"]
    assert row.line().count("|") == growth_header(None).splitlines()[0].count("|")
    row.cpu_ms["keeping"] = []
    assert row.ratios("keeping") == []
    cells = row.line().split(" | ")
    assert cells[4] == "–" and cells[8] == "–"
    assert row.line().count("|") == growth_header(None).splitlines()[0].count("|")


class _Readings:
    """A process whose CPU readings are scripted: busy for a while, then idle."""

    def __init__(self, readings: list[float]) -> None:
        self.readings = readings
        self.read = 0

    def cpu_seconds(self) -> float:
        value = self.readings[min(self.read, len(self.readings) - 1)]
        self.read += 1
        return value


def test_the_growth_table_waits_out_what_a_take_in_leaves_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Indexing what an unmeasured take-in archived is not counted to the calls after it: the
    process is read until it idles, and one still busy at the limit is measured as it is."""
    import asyncio

    from keeper_bench.proxy import growth

    monkeypatch.setattr(growth, "SETTLE_EVERY", 0.001)
    busy_then_idle = _Readings([0.0, 0.05, 0.10, 0.15, 0.1505, 0.30])
    asyncio.run(growth.settled(busy_then_idle))  # type: ignore[arg-type]
    assert busy_then_idle.read == 5  # stopped at the first quiet reading, not after it
    always_busy = _Readings([0.01 * n for n in range(100_000)])
    waited = asyncio.run(growth.settled(always_busy, limit=0.05))  # type: ignore[arg-type]
    assert waited >= 0.05 and always_busy.read < 100_000


def test_the_growth_table_says_how_long_it_waited_for_each_process() -> None:
    """The wait left out of the table is shown under it when any process took longer than a
    read or two; a table whose processes all idled at once says nothing of it."""
    from keeper_bench.proxy.growth import GrowthRow, settle_lines

    quiet, busy = GrowthRow(200, 1), GrowthRow(5000, 1)
    for row in (quiet, busy):
        row.settle_s.update(relay=[0.1], floor=[0.1], keeping=[0.1])
        row.settle_s["keeper-proxy"] = [0.1, 0.1]
    assert settle_lines([quiet]) == []
    busy.settle_s["keeper-proxy"] = [2.4, 1.9]
    (line,) = settle_lines([quiet, busy])
    assert "keeper-proxy 2.4 s" in line and "relay 0.1 s" in line and "baseline" not in line


_BUSY_THREAD = """
import threading, time
def burn():
    started = time.thread_time()
    while time.thread_time() - started < 0.1:
        pass
    print("burnt", flush=True)
    time.sleep(60)
threading.Thread(target=burn, daemon=True).start()
time.sleep(60)
"""


def test_a_process_s_cpu_splits_into_its_event_loop_s_thread_and_the_rest() -> None:
    """CPU another thread spends shows in the process's total and not in its main thread's,
    which is how the growth table tells the event loop's work from the workers'. (A process of
    its own, whose busy thread stays alive while both are read: an ended thread leaves the
    total, and this test process's own threads come and go.)"""
    import subprocess
    import sys

    from keeper_bench.proxy.servers import ProxyProcess

    child = subprocess.Popen(
        [sys.executable, "-c", _BUSY_THREAD], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "burnt"
        process = ProxyProcess(child.pid, "")
        total, loop = process.cpu_seconds(), process.loop_cpu_seconds()
        assert total - loop >= 0.095  # the busy thread's 0.1 s, on top of the main thread's
        assert 0 < loop < total
    finally:
        child.kill()
        child.wait()


def test_the_growth_table_says_which_thread_each_path_spent_its_cpu_on() -> None:
    """Each path's CPU a request is split into its event loop's part and the rest, medians of
    the passes; a path whose threads were not read is left out, and nothing read, no table."""
    from keeper_bench.proxy.growth import GrowthRow, thread_lines

    row = GrowthRow(20, 1)
    row.cpu_ms.update(floor=[0.5, 0.4, 0.6], keeping=[0.7, 0.7, 0.7])
    row.loop_ms.update(floor=[0.5, 0.4, 0.6], keeping=[0.5, 0.55, 0.5])
    row.cpu_ms["keeper-proxy"] = [1.6, 1.8, 1.7]
    row.loop_ms["keeper-proxy"] = [0.8, 0.9, 0.85]
    lines = thread_lines([row])
    header = next(line for line in lines if line.startswith("| messages"))
    assert header == "| messages | fair floor | keeping floor | keeper-proxy |"
    assert "| 20 | 0.50 / 0.00 | 0.50 / 0.20 | 0.85 / 0.85 |" in lines
    assert thread_lines([GrowthRow(20, 1)]) == []
