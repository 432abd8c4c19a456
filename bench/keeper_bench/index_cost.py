"""What indexing costs the agent now that it runs off the step's path.

``keeper-bench index-cost`` prints three tables:

1. **A step with a cut at a large archive** (one session of ``--messages`` chat messages, default
   1M), wall p50/p95, the keyword retriever and the hybrid (keyword + MiniLM, the product's
   defaults) side by side, steps interleaved so both see the same machine. Each step archives
   what leaves a 32K window; its passages are embedded by the process's worker in the
   background, during the pause after the step (``--think``: the agent's model call) and the
   next steps. Also the first search after each cut (it may run its session's catch-up itself).
2. **Search at that size**: p50/p95 of a search (the session's index check and the retriever's
   search, MiniLM embedding each question for the hybrid).
3. **Sustained indexing with many sessions cutting at once** (``--sessions``, default 8, on one
   keeper): messages and vectors indexed a second from the first cut until the index has caught
   up, and the steps' latency under that load.

The large archive is built once (``--keep DIR`` reuses it; :mod:`.index_builds`), its index
``BULK_SLICE`` turns at a time (progress printed and saved, so a stopped build goes on).
Building 1M messages with MiniLM would take hours here, so by default the bulk's vectors come
from the hashing embedder under MiniLM's name (``--bulk``: or MiniLM's int8 graph, or MiniLM
itself); everything the steps add, and every query, is embedded by the real MiniLM. Wall times
on a shared machine measure the neighbours too: the load average is printed beside each table.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from keeper_bench.chat_lines import NAMES, QUESTIONS, WORDS, chat_message, content_words
from keeper_bench.index_builds import (
    BULK_EMBEDDERS,
    SESSION,
    build_archive,
    build_tantivy,
    load,
)
from keeper_middleware.config import KeeperConfig
from keeper_middleware.keeper import Keeper, ModelSetup
from keeper_middleware.retrievers.base import search_and_count
from keeper_middleware.retrievers.embedders import embedder_name


def make_embedder(name: str) -> Any:
    """The embedder the keepers use: ``minilm`` (the product's default) or ``hashing`` (tests)."""
    from keeper_middleware.retrievers.embedders import HashingEmbedder, MiniLMEmbedder

    return HashingEmbedder(dim=384) if name == "hashing" else MiniLMEmbedder()


def hybrid_keeper(
    config: KeeperConfig, archive: Path, embedder: Any, engine: str = "fts5"
) -> Keeper:
    """A keeper with the hybrid retriever as the keeper makes its own (searches do not wait for
    vectors still being made), with the chosen embedder and keyword engine."""
    from keeper_middleware.retrievers.factory import make_retriever

    retriever = make_retriever(
        "hybrid",
        path=archive.with_suffix(".index"),
        embedder=embedder,
        vectors_may_lag=True,
        keyword_engine=engine,
    )
    return Keeper(config, archive=archive, retriever=retriever)


def window_messages(
    rng: random.Random, tag: str, first: int, window_tokens: int
) -> list[BaseMessage]:
    """A conversation that fills most of a window: the task, then user and assistant turns."""
    messages: list[BaseMessage] = [HumanMessage("Task: chat with me and remember.", id=f"{tag}t")]
    size, n = 0, first
    while size < window_tokens * 3.4:  # about 0.85 of the window in tokens
        text = chat_message(rng, n, sentences=3)
        messages += [
            HumanMessage(f"Item {n}. {text}", id=f"{tag}h{n}"),
            AIMessage("That sounds lovely; tell me more.", id=f"{tag}a{n}"),
        ]
        size += len(text) + 34
        n += 1
    return messages


def no_changes(messages: Sequence[BaseMessage], kwargs: Any) -> AIMessage:
    return AIMessage("NO CHANGES")


def quantiles(samples: Sequence[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]


def step_and_search(
    keepers: dict[str, Keeper], steps: int, think: float, session: str
) -> dict[str, dict[str, list[float]]]:
    """Interleaved steps with a cut (and the first search after each) for each keeper."""
    config = next(iter(keepers.values())).config
    setup = ModelSetup(system_prompt="You chat.")
    rng = random.Random(11)
    times: dict[str, dict[str, list[float]]] = {
        name: {"step": [], "search": []} for name in keepers
    }
    for r in range(steps):
        for name, keeper in keepers.items():
            messages = window_messages(rng, f"{name}{r}-", 10_000_000 + r * 1000, config.window)
            started = time.perf_counter()
            result = keeper.step(session, messages, None, setup, no_changes)
            times[name]["step"].append(time.perf_counter() - started)
            assert result.cut, "the full window did not cut"
            if think:
                time.sleep(think)
            question = QUESTIONS[r % len(QUESTIONS)].format(
                a=NAMES[r % 8], b=NAMES[(r + 1) % 8], w=WORDS[r % len(WORDS)], v=WORDS[r * 3 % 40]
            )
            started = time.perf_counter()
            keeper.search(session, question)
            times[name]["search"].append(time.perf_counter() - started)
    return times


def measure_searches(
    keepers: dict[str, Keeper],
    count: int,
    session: str,
    k: int | str = 10,
    vocabulary: str = "chat",
) -> dict[str, tuple[list[float], list[float], list[float]]]:
    """Wall time, the searching thread's CPU time and the process's of ``count`` searches each
    (the session's index check and the retriever's search for ``k`` hits; ``k="tool"``: what
    the search tool asks, ``KeeperConfig.search_results`` hits and the matches counted up to
    ``search_scan``). On a shared machine the wall time measures the queue for a CPU too; the
    CPU time is what a search needs (the process's: chroma searches on threads of its own)."""
    rng = random.Random(5)
    found: dict[str, tuple[list[float], list[float], list[float]]] = {
        name: ([], [], []) for name in keepers
    }
    questions = []
    for _ in range(count):
        template, a, b = rng.choice(QUESTIONS), rng.choice(NAMES), rng.choice(NAMES)
        w, v = content_words(rng, 2, vocabulary)
        questions.append(template.format(a=a, b=b, w=w, v=v))
    for keeper in keepers.values():
        keeper.indexing.drain()
    for question in questions:
        for name, keeper in keepers.items():
            started, cpu, process = time.perf_counter(), time.thread_time(), time.process_time()
            keeper.indexing.ready(session)
            if k == "tool":
                search_and_count(
                    keeper.retriever,
                    question,
                    session=session,
                    k=keeper.config.search_results,
                    limit=keeper.config.search_scan,
                )
            else:
                keeper.retriever.search(question, session=session, k=int(k))
            found[name][0].append(time.perf_counter() - started)
            found[name][1].append(time.thread_time() - cpu)
            found[name][2].append(time.process_time() - process)
    return found


def many_sessions(sessions: int, duration: float, folder: Path, embedder: Any) -> dict[str, float]:
    """``sessions`` threads cutting on one hybrid keeper for ``duration`` seconds."""
    keeper = hybrid_keeper(KeeperConfig(), folder / "many.sqlite3", embedder)
    keeper.search("warm-up", "load the model")  # the model loads once, outside the timing
    setup = ModelSetup(system_prompt="You chat.")
    steps: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + duration

    def run(n: int) -> None:
        rng = random.Random(n)
        r = 0
        while time.monotonic() < stop:
            messages = window_messages(rng, f"s{n}r{r}-", r * 1000, keeper.config.window)
            started = time.perf_counter()
            keeper.step(f"s{n}", messages, None, setup, no_changes)
            with lock:
                steps.append(time.perf_counter() - started)
            r += 1

    started, cpu = time.perf_counter(), time.process_time()
    threads = [threading.Thread(target=run, args=(n,)) for n in range(sessions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stepped = time.perf_counter() - started
    backlog = keeper.indexing.pending()
    keeper.indexing.drain()
    keeper.retriever.flush()
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu
    turns = sum(keeper.archive.turn_count(f"s{n}") for n in range(sessions))
    passages = sum(keeper.retriever.count(f"s{n}") for n in range(sessions))
    keeper.close()
    p50, p95 = quantiles(steps)
    return {
        "steps": len(steps),
        "step_p50": p50,
        "step_p95": p95,
        "stepping_s": stepped,
        "caught_up_s": elapsed,
        "backlog_sessions": backlog,
        "turns": turns,
        "passages": passages,
        "cpu_s": cpu,
    }


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages in the archive")
    parser.add_argument("--keep", type=Path, default=None, help="build the archive here, reuse it")
    parser.add_argument("--steps", type=int, default=20, help="steps with a cut per retriever")
    parser.add_argument(
        "--think", type=float, default=2.0, help="seconds between a step and its search"
    )
    parser.add_argument("--searches", type=int, default=200, help="searches per retriever")
    parser.add_argument("--sessions", type=int, default=8, help="sessions cutting at once")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds they cut for")
    parser.add_argument("--skip", default="", help="comma-separated: steps, searches, sessions")
    parser.add_argument(
        "--embedder", choices=("minilm", "hashing"), default="minilm", help="hashing: tests only"
    )
    parser.add_argument(
        "--retrievers",
        default="keyword,hybrid",
        help="comma-separated: keyword, hybrid (keyword alone builds no vectors)",
    )
    parser.add_argument(
        "--k",
        default="10",
        help="comma-separated hits a search asks for; tool: what the search tool asks (10 hits, "
        "the matches counted up to 200)",
    )
    parser.add_argument(
        "--vocabulary",
        choices=("chat", "zipf"),
        default="chat",
        help="the words of the archive and the questions: 45 chat words, or 50,000 at natural "
        "(Zipf) frequencies",
    )
    parser.add_argument(
        "--engines",
        default="fts5",
        help="comma-separated keyword engines measured side by side: fts5, tantivy",
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=2_000,
        help="passages a commit when tantivy's index is built from the archive (2,000: what a "
        "catch-up hands over; larger: fewer commits, for 10M)",
    )
    parser.add_argument(
        "--bulk",
        choices=BULK_EMBEDDERS,
        default="hashing",
        help="what makes the large archive's vectors (stored under MiniLM's name; every query is "
        "embedded by --embedder): hashing (fast; only the index's size matters to the timings), "
        "minilm-q8 (MiniLM's int8 graph), minilm (the model itself)",
    )
    parser.add_argument("--out", type=Path, default=None, help="also write the tables here")


def _run(args: argparse.Namespace) -> int:
    import tempfile

    skip = set(args.skip.split(","))
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    scratch = Path(tempfile.mkdtemp(prefix="keeper-index-cost-"))
    folder = args.keep or scratch / "archive"
    say(f"# Indexing off the step's path (load average at start {load()})")
    say("")
    chosen = [name for name in args.retrievers.split(",") if name]
    if not chosen or set(chosen) - {"keyword", "hybrid"}:
        raise SystemExit(f"--retrievers takes keyword and/or hybrid, got {args.retrievers!r}")
    hybrid = "hybrid" in chosen
    if not {"steps", "searches"} <= skip:
        embedder = make_embedder(args.embedder)
        engines = [name for name in args.engines.split(",") if name]
        if not engines or set(engines) - {"fts5", "tantivy"}:
            raise SystemExit(f"--engines takes fts5 and/or tantivy, got {args.engines!r}")
        path = build_archive(
            folder,
            args.messages,
            say=say,
            embedder_name=embedder_name(embedder),
            vectors=hybrid,
            vocabulary=args.vocabulary,
            keyword="fts5" in engines,
            bulk=args.bulk,
        )
        if "tantivy" in engines:
            build_tantivy(path, say=say, batch=args.batch)
        keyword_copy = path  # searches alone change nothing: no copy to make
        if "steps" not in skip:
            keyword_copy = scratch / "keyword" / "archive.sqlite3"
            keyword_copy.parent.mkdir(parents=True)
            shutil.copy(path, keyword_copy)
            shutil.copytree(  # the keyword indexes only
                path.with_suffix(".index"),
                keyword_copy.with_suffix(".index"),
                ignore=shutil.ignore_patterns("chroma"),
            )
        keepers: dict[str, Keeper] = {}
        for engine in engines:
            config = KeeperConfig(notes_every_items=None, keyword_engine=engine)
            tag = "" if engine == "fts5" else f" ({engine})"
            for name in chosen:
                if name == "keyword":
                    keepers[name + tag] = Keeper(config, archive=keyword_copy, retriever="keyword")
                else:
                    keepers[name + tag] = hybrid_keeper(config, path, embedder, engine)
                    keepers[name + tag].search(SESSION, "load the model")  # outside the timing
        if "steps" not in skip:
            before = load()
            times = step_and_search(keepers, args.steps, args.think, SESSION)
            say(
                f"## A step with a cut at {args.messages:,} archived messages ({args.steps} each, "
                f"interleaved; {args.think:g} s between a step and its search; load {before} → "
                f"{load()})"
            )
            say("")
            say(
                "| retriever | step p50 (ms) | step p95 (ms) | first search after the cut p50 / p95 (ms) |"
            )
            say("|---|---:|---:|---|")
            for name, found in times.items():
                step50, step95 = quantiles(found["step"])
                search50, search95 = quantiles(found["search"])
                say(
                    f"| {name} | {step50 * 1000:.1f} | {step95 * 1000:.1f} | "
                    f"{search50 * 1000:.1f} / {search95 * 1000:.1f} |"
                )
            say("")
        for k in (k for k in args.k.split(",") if k) if "searches" not in skip else ():
            before = load()
            searched = measure_searches(keepers, args.searches, SESSION, k, args.vocabulary)
            asked = "the search tool's search" if k == "tool" else f"k={k}"
            say(
                f"## Search at {args.messages:,} messages of {args.vocabulary} words "
                f"({args.searches} questions each, "
                f"{asked}, index caught up; load {before} → {load()})"
            )
            say("")
            say(
                "| retriever | search p50 (ms) | search p95 (ms) | CPU p50 (ms) | CPU p95 (ms) "
                "| process CPU p50 / p95 (ms) |"
            )
            say("|---|---:|---:|---:|---:|---|")
            for name, (wall, cpu, process) in searched.items():
                p50, p95 = quantiles(wall)
                cpu50, cpu95 = quantiles(cpu)
                all50, all95 = quantiles(process)
                say(
                    f"| {name} | {p50 * 1000:.1f} | {p95 * 1000:.1f} | {cpu50 * 1000:.1f} | "
                    f"{cpu95 * 1000:.1f} | {all50 * 1000:.1f} / {all95 * 1000:.1f} |"
                )
            say("")
        for keeper in keepers.values():
            keeper.close()
    if "sessions" not in skip:
        before = load()
        row = many_sessions(args.sessions, args.duration, scratch, make_embedder(args.embedder))
        say(
            f"## {args.sessions} sessions cutting at once on one hybrid keeper for "
            f"{args.duration:g} s (no pause between steps; load {before} → {load()})"
        )
        say("")
        say(
            "| steps | step p50 / p95 (ms) | messages archived | passages indexed | time until "
            "the index caught up (s) | messages indexed a second | process CPU (s) |"
        )
        say("|---:|---|---:|---:|---:|---:|---:|")
        say(
            f"| {row['steps']:.0f} | {row['step_p50'] * 1000:.0f} / {row['step_p95'] * 1000:.0f} "
            f"| {row['turns']:,.0f} | {row['passages']:,.0f} | {row['caught_up_s']:.0f} "
            f"(steps {row['stepping_s']:.0f}, {row['backlog_sessions']:.0f} sessions queued at "
            f"their end) | {row['turns'] / row['caught_up_s']:.1f} | {row['cpu_s']:.0f} |"
        )
    shutil.rmtree(scratch, ignore_errors=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
    return 0


def register_commands(register: Callable[[Any], None]) -> None:
    """Adds ``keeper-bench index-cost``."""
    from keeper_bench.cli import Command

    register(
        Command(
            "index-cost",
            "a step with a cut and search at 1M messages; 8 sessions",
            _configure,
            _run,
        )
    )
