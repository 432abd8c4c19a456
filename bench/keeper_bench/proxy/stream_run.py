"""A benchmark stream through the keeper proxy, driven by an agent that manages nothing.

    python -m keeper_bench.proxy.stream_run --size 1m --window 32768 --out runs/proxy-1m

The simulated reader is served over HTTP, the proxy sits in front of it, and an agent loop using
the official ``openai`` client keeps its whole history and sends all of it on every call: the
task, each batch as a user message, its own replies, each questions message. The proxy is the only
thing between that history and the reader's window. A meter in front of the reader records every
request the upstream receives, so "never more than the window" is measured where it matters.

The run folder is the ``keeper-bench`` format (``run.json``, ``answers.jsonl``, ``notes.jsonl``;
see ``cli.py``), so ``keeper-bench grade/audit`` read it; ``proxy.json`` adds the proxy's
session report, the upstream meter and the wall time, ``metrics.txt`` the ``/metrics`` page. With
``--compare`` the in-graph keeper (the ``notes`` arm) runs the same stream and window into
``OUT/in-graph`` for the score comparison. The stream is generated into ``OUT/stream`` and the
proxy keeps its archive in ``OUT/proxy``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from keeper_bench.audit import NotesVersion, audit_notes
from keeper_bench.cli import grade_run, read_run
from keeper_bench.grader import SIMULATED_READER, GradeResult
from keeper_bench.ledger import Ledger
from keeper_bench.reader.server import create_reader_app, parse_messages
from keeper_bench.run_options import resolve_stream
from keeper_bench.steps import SYSTEM_PROMPT, Step, plan_steps
from keeper_bench.streams import SIZES, read_stream
from keeper_middleware.config import KeeperConfig
from keeper_middleware.integrations.proxy.cli import serve_in_thread
from keeper_middleware.tokens.counting import ApproximateTokenCounter

LABEL = "keeper proxy"
AGENT_MODEL = "simulated-reader"


# -- the meter in front of the upstream ---------------------------------------------------------
@dataclass(slots=True)
class UpstreamMeter:
    """ASGI middleware that measures every chat request before the app behind it reads it.

    Tokens are counted with the keeper's default counter (the one its window budget uses), over
    the messages and tool schemas the upstream actually received.
    """

    app: ASGIApp
    requests: int = 0
    largest_tokens: int = 0
    largest_bytes: int = 0
    total_bytes: int = 0
    counter: ApproximateTokenCounter = field(default_factory=ApproximateTokenCounter)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope["path"]).endswith("/chat/completions"):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = bool(message.get("more_body", False))
        body = b"".join(chunks)
        self.measure(body)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    def measure(self, body: bytes) -> None:
        self.requests += 1
        self.total_bytes += len(body)
        self.largest_bytes = max(self.largest_bytes, len(body))
        try:
            data = json.loads(body)
            messages = parse_messages(data.get("messages"))
            tokens = self.counter.count_messages(messages, list(data.get("tools") or ()))
        except (ValueError, AttributeError, TypeError):
            return  # the app behind answers the bad request itself
        self.largest_tokens = max(self.largest_tokens, tokens)

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "largest_request_tokens": self.largest_tokens,
            "largest_request_bytes": self.largest_bytes,
            "total_bytes": self.total_bytes,
        }


@contextmanager
def metered_reader() -> Iterator[tuple[str, UpstreamMeter]]:
    """The simulated reader over HTTP behind an :class:`UpstreamMeter`: (base URL, meter)."""
    meter = UpstreamMeter(create_reader_app())
    with serve_in_thread(meter, lifespan="off") as url:
        yield url, meter


# -- the agent ----------------------------------------------------------------------------------
def run_agent(
    base_url: str,
    steps: Sequence[Step],
    on_answer: Callable[[Mapping[str, Any], str], None],
    *,
    on_step: Callable[[Step, int], None] | None = None,
) -> int:
    """An unmodified agent: its whole history on every call, nothing managed. Returns the size in
    bytes of its history as JSON when it sent it last (its largest request's messages)."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=600.0)
    history: list[dict[str, Any]] = []
    size = 0

    def add(message: dict[str, Any]) -> None:
        nonlocal size  # ``json.dumps(history)``: the brackets, each item, ", " between them
        history.append(message)
        size += len(json.dumps(message, ensure_ascii=False).encode()) + 2

    add({"role": "system", "content": SYSTEM_PROMPT})
    largest = 0
    try:
        for step in steps:
            add({"role": "user", "content": step.message})
            largest = size
            completion = client.chat.completions.create(
                model=AGENT_MODEL,
                messages=history,  # type: ignore[arg-type]
            )
            reply = completion.choices[0].message.content or ""
            add({"role": "assistant", "content": reply})
            if step.question is not None:
                on_answer(step.question, reply)
            if on_step is not None:
                on_step(step, largest)
    finally:
        client.close()
    return largest


# -- the run ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ProxyRunResult:
    run_dir: Path
    grade: GradeResult
    report: dict[str, Any]
    """What ``proxy.json`` holds: the session report, metrics, meter, sizes and times."""


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_jsonl(path: Path, records: Iterable[Mapping[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")


def _keeper_config(window: int) -> KeeperConfig:
    """The in-graph ``notes`` arm's settings, so both sides of the comparison keep alike."""
    from keeper_bench.arms import default_retrieved_per_question
    from keeper_middleware.graphs.keeper_arms import keeper_arm_config

    return keeper_arm_config(
        "notes",
        window=window,
        reply_reserve=None,
        retrieved_per_question=default_retrieved_per_question(window),
    )


def run_through_proxy(
    stream: Path, run_dir: Path, *, window: int, progress: bool = False
) -> ProxyRunResult:
    """Drive the agent through the proxy over ``stream`` into a fresh ``run_dir``."""
    from keeper_middleware.integrations.proxy import create_proxy_app

    if (run_dir / "answers.jsonl").exists():
        raise FileExistsError(f"{run_dir} already holds a run; choose another --out folder")
    run_dir.mkdir(parents=True, exist_ok=True)
    run = {
        "stream": os.path.relpath(stream.resolve(), run_dir.resolve()),
        "reader": SIMULATED_READER,
        "label": LABEL,
        "arm": "proxy",
        "window": window,
    }
    _write_json(run_dir / "run.json", run)
    steps = list(plan_steps(read_stream(stream), "messages"))
    answers: list[dict[str, Any]] = []

    def keep_answer(question: Mapping[str, Any], reply: str) -> None:
        answers.append(
            {
                "after_item": int(question["after_item"]),
                "final": bool(question["final"]),
                "reply": reply,
            }
        )

    started = time.perf_counter()
    shown = _progress_printer(len(steps), started) if progress else None
    with metered_reader() as (url, meter):
        app = create_proxy_app(
            url, window=window, archive_dir=run_dir / "proxy", config=_keeper_config(window)
        )
        proxy = app.state.proxy
        with serve_in_thread(app) as proxy_url:
            largest_agent = run_agent(proxy_url, steps, keep_answer, on_step=shown)
            seconds = time.perf_counter() - started
            (session,) = proxy.sessions()
            root = proxy_url.removesuffix("/v1")
            report_page = httpx.get(f"{root}/keeper/sessions/{session}", timeout=60).json()
            metrics = httpx.get(f"{root}/metrics", timeout=60).text
            # one NOTES version at a time: a long run's versions add up to gigabytes
            _write_jsonl(
                run_dir / "notes.jsonl",
                (
                    {
                        "version": v.version,
                        "first_item": v.first_item,
                        "last_item": v.last_item,
                        "text": v.text,
                    }
                    for v in proxy.keeper.archive.notes_versions(session)
                ),
            )
    _write_jsonl(run_dir / "answers.jsonl", answers)
    (run_dir / "metrics.txt").write_text(metrics, encoding="utf-8")
    grade = grade_run(run_dir)
    _write_json(run_dir / "grade.json", grade.to_json())
    _, stream_folder = read_run(run_dir)
    with (run_dir / "notes.jsonl").open(encoding="utf-8") as handle:
        versions = (NotesVersion.from_json(json.loads(line)) for line in handle if line.strip())
        audit = audit_notes(versions, Ledger.load(stream_folder))
    _write_json(run_dir / "audit.json", audit.to_json())
    report = {
        "window": window,
        "steps": len(steps),
        "wall_seconds": round(seconds, 1),
        "largest_agent_request_bytes": largest_agent,
        "upstream": meter.to_json(),
        "audit": {k: v for k, v in audit.to_json().items() if not isinstance(v, list | dict)},
        "session": {k: v for k, v in report_page.items() if k != "notes"},
    }
    _write_json(run_dir / "proxy.json", report)
    return ProxyRunResult(run_dir, grade, report)


def _progress_printer(total: int, started: float) -> Callable[[Step, int], None]:
    def show(step: Step, largest: int) -> None:
        if step.index % 100 == 0 or step.index == total - 1:
            elapsed = time.perf_counter() - started
            print(
                f"step {step.index + 1}/{total} item {step.last_item} "
                f"history ~{step.history_tokens:,} tokens, request {largest / 1e6:.1f} MB, "
                f"{elapsed:.0f} s",
                file=sys.stderr,
                flush=True,
            )

    return show


def run_in_graph(stream: Path, run_dir: Path, *, window: int) -> InGraph:
    """The in-graph keeper (the ``notes`` arm) on the same stream and window."""
    from keeper_bench.run_options import RunOptions
    from keeper_bench.runner import run_arm

    options = RunOptions.create(arm="notes", stream=stream, window=window, label="in-graph keeper")
    result = run_arm(options, run_dir, progress=False)
    counters = json.loads((run_dir / "keeper_counters.json").read_text(encoding="utf-8"))
    return InGraph(result.grade, result.seconds, counters, _replies(run_dir))


@dataclass(frozen=True, slots=True)
class InGraph:
    grade: GradeResult
    seconds: float
    counters: Mapping[str, Any]
    replies: Mapping[tuple[int, bool], str]


def _replies(run_dir: Path) -> dict[tuple[int, bool], str]:
    lines = (run_dir / "answers.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return {(int(r["after_item"]), bool(r["final"])): str(r["reply"]) for r in records}


# -- the results table --------------------------------------------------------------------------
def results_markdown(result: ProxyRunResult, size: str, in_graph: InGraph | None) -> str:
    report, session = result.report, result.report["session"]
    upstream, proxy, counters = report["upstream"], session["proxy"], session["counters"]
    requests = max(1, int(proxy["requests"]))
    largest, window = upstream["largest_request_tokens"], report["window"]
    added = proxy["added_seconds"]
    rows = [
        ("agent calls (steps)", f"{report['steps']:,}"),
        ("largest agent request", f"{report['largest_agent_request_bytes'] / 1e6:.1f} MB"),
        ("upstream requests", f"{upstream['requests']:,}"),
        (
            "largest upstream request",
            f"{largest:,} tokens ({upstream['largest_request_bytes'] / 1e3:.0f} kB)",
        ),
        ("within the window", "yes" if largest <= window else "NO"),
        ("wall time (agent, proxy and reader in one process)", f"{report['wall_seconds']:,.0f} s"),
        ("proxy added", f"{added:.1f} s ({1000 * added / requests:.1f} ms a request)"),
        ("waiting for the upstream", f"{proxy['upstream_seconds']:.1f} s"),
        (
            "upstream calls / search rounds",
            f"{proxy['upstream_calls']:,} / {proxy['search_rounds']:,}",
        ),
        (
            "cuts / notes calls / re-asks",
            f"{counters['cuts']:,} / {counters['notes_calls']:,} / {counters['reasks']:,}",
        ),
        (
            "archive turns / notes versions",
            f"{session['archive_turns']:,} / {session['notes_versions']:,}",
        ),
        ("peak window (keeper's count)", f"{counters['peak_window']:,} tokens"),
        ("prefix-cached share of prompt tokens", f"{session['cached_ratio']:.0%}"),
    ]
    if "audit" in report:
        audit = report["audit"]
        rows.append(
            (
                "notes audit: versions / counter lines / wrong per 1,000 / missing",
                f"{audit['versions_audited']:,} / {audit['total_lines']:,} / "
                f"{audit['silent_wrong_per_1000_lines']:.2f} / {audit['missing_lines']:,}",
            )
        )
    lines = [
        f"# Keeper proxy, {size} stream (rules + overdrawn), window {window:,} tokens",
        "",
        "An unmodified agent (official `openai` client, whole history on every call) through the "
        "keeper proxy, with the simulated reader upstream over HTTP. Scores are the simulated "
        "reader's, not a language model's. *Proxy added*: the proxy's `added_seconds` counter, "
        "from the parsed request to the reply minus the upstream wait, so it includes the "
        "keeper's cuts and notes bookkeeping.",
        "",
        "| measure | value |",
        "| --- | --- |",
        *(f"| {name} | {value} |" for name, value in rows),
        "",
        "## Score (simulated reader)",
        "",
        result.grade.markdown(),
    ]
    if in_graph is not None:
        grade, mine, theirs = in_graph.grade, _replies(result.run_dir), in_graph.replies
        same = sum(1 for key, reply in mine.items() if theirs.get(key) == reply)
        lines += [
            "",
            "## In-graph keeper (`notes` arm), same stream and window",
            "",
            f"Proxy {result.grade.right}/{result.grade.asked}, "
            f"in-graph {grade.right}/{grade.asked} ({in_graph.seconds:,.0f} s); {same} of {len(mine)} question replies are identical "
            "word for word. In-graph cuts / notes calls / re-asks: "
            f"{in_graph.counters['cuts']:,} / {in_graph.counters['notes_calls']:,} / "
            f"{in_graph.counters['reasks']:,}; peak window {in_graph.counters['peak_window']:,} "
            "tokens.",
            "",
            grade.markdown(),
        ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--size", default="1m", choices=sorted(SIZES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--window", type=int, default=32_768)
    parser.add_argument("--out", type=Path, default=Path("runs/proxy-1m"))
    parser.add_argument("--compare", action="store_true", help="also run the in-graph keeper")
    parser.add_argument("--results", type=Path, default=None, help="write the markdown table here")
    args = parser.parse_args(argv)
    stream = resolve_stream(f"{args.size}:rules+overdrawn", args.out / "stream", seed=args.seed)
    result = run_through_proxy(stream, args.out, window=args.window, progress=True)
    in_graph = (
        run_in_graph(stream, args.out / "in-graph", window=args.window) if args.compare else None
    )
    table = results_markdown(result, args.size, in_graph)
    if args.results is not None:
        args.results.write_text(table, encoding="utf-8")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
