"""``keeper-bench locomo recall|answer``: LoCoMo from a file the user gives.

    keeper-bench locomo recall --data locomo10.json
    keeper-bench locomo recall --data dev.json --data tune.json --halves --embed-cache /tmp/vectors
    keeper-bench locomo answer --data locomo10.json --arm rag --model openai:http://127.0.0.1:8080/v1
    keeper-bench locomo index --data locomo10.json --embedders minilm,minilm-q8

``recall`` measures retrieval alone (no model); ``answer`` runs arms with a model and grades the
answers as the dataset's paper does; ``index`` times the embedding backend indexing the turns.
Given several conversations, ``recall`` also prints each conversation's figures apart
(``keeper_bench.locomo.spread``). Each prints a markdown table and can write it (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from collections.abc import Callable
from pathlib import Path

from keeper_bench.cli import Command
from keeper_bench.locomo.dataset import Conversation, load_locomo
from keeper_bench.locomo.methods import DEFAULT_METHODS, MethodSpec, configuration
from keeper_bench.locomo.recall import render
from keeper_bench.locomo.spread import Spread, measure_spread, render_spread
from keeper_bench.locomo.vector_cache import load_cached_vectors, save_cached_vectors
from keeper_middleware.retrievers.embedders import Embedder


def _configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="locomo_action", required=True)
    recall = actions.add_parser("recall", help="retrieval recall@k, latency and indexing rate")
    source = recall.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--data",
        type=Path,
        action="append",
        help="LoCoMo's JSON file (repeat for several; each may hold several conversations)",
    )
    source.add_argument(
        "--stream",
        help="instead, the benchmark's own stream: a folder or a preset SIZE[:FAMILY+...] "
        "(e.g. small:varied), its batches as turns",
    )
    recall.add_argument(
        "--seeds", default="0", help="comma-separated seeds of a preset --stream, one stream each"
    )
    recall.add_argument(
        "--methods",
        default=",".join(DEFAULT_METHODS),
        help="comma-separated methods, e.g. keyword,hybrid:minilm-int8:w=1.5,bm25s (see "
        "bench/keeper_bench/locomo/recall.py)",
    )
    recall.add_argument("--conversations", default="", help="sample ids to keep (default all)")
    recall.add_argument(
        "--halves",
        action="store_true",
        help="report the questions of even and of odd index apart (choose a setting on one "
        "half, check it on the other)",
    )
    recall.add_argument(
        "--embed-cache",
        type=Path,
        default=None,
        help="a folder keeping every embedder's vectors between runs (a method served from it "
        "has no indexing rate)",
    )
    recall.add_argument("--out", type=Path, default=None, help="write the table here too")
    recall.add_argument("--json", type=Path, default=None, help="write the figures as JSON")
    index = actions.add_parser("index", help="the embedding backend's indexing rate")
    index.add_argument("--data", type=Path, required=True, help="LoCoMo's JSON file")
    index.add_argument("--embedders", default="minilm", help="comma-separated embedder names")
    index.add_argument(
        "--sentence-vectors",
        choices=("on", "off", "both"),
        default="both",
        help="also one vector per sentence of a message (the default of the backend: on)",
    )
    index.add_argument(
        "--sentence-words",
        default="",
        help="comma-separated: a sentence vector covers consecutive sentences of at least this "
        "many words (1: one per sentence; default: the backend's)",
    )
    index.add_argument(
        "--threads",
        type=int,
        default=None,
        help="batches the model runs side by side, one thread each (default: the CPUs, at most 4)",
    )
    index.add_argument("--repeat", type=int, default=1, help="index the turns this many times")
    index.add_argument("--conversations", default="", help="sample ids to keep (default all)")
    index.add_argument("--out", type=Path, default=None, help="write the table here too")
    from keeper_bench.locomo.answers import configure_answer

    configure_answer(actions.add_parser("answer", help="run arms with a model; token-F1 grade"))


def _run(args: argparse.Namespace) -> int:
    if args.locomo_action == "answer":
        from keeper_bench.locomo.answers import run_answer_command

        return run_answer_command(args)
    conversations, source = _conversations(args)
    if args.conversations:
        wanted = set(args.conversations.split(","))
        conversations = [c for c in conversations if c.sample_id in wanted]
    if args.locomo_action == "index":
        return _run_index(args, conversations, source)
    load = os.getloadavg()
    embedders: dict[str, Embedder] = {}
    results = []
    spreads: list[Spread] = []
    for method in (m for m in args.methods.split(",") if m.strip()):
        spec = MethodSpec.parse(method.strip())
        print(f"{method.strip()}: {configuration(spec)}", flush=True)
        if args.embed_cache and spec.backend in ("embedding", "hybrid", "cosine"):
            load_cached_vectors(args.embed_cache, spec.embedder, embedders)
        spread = measure_spread(method.strip(), conversations, embedders, halves=args.halves)
        spreads.append(spread)
        results += spread.pooled
        print("\n".join(render(spread.pooled, title="").splitlines()[-len(spread.pooled) :]))
        if args.embed_cache:
            save_cached_vectors(args.embed_cache, embedders)
        if len(conversations) > 1:
            print(render_spread([spreads[0], spread]).splitlines()[-1], flush=True)
    note = (
        f"{len(conversations)} conversation(s) ({', '.join(c.sample_id for c in conversations)}) "
        f"from `{source}`; load average before the run "
        f"{', '.join(f'{x:.1f}' for x in load)}, after it "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} (1, 5, 15 min) on {os.cpu_count()} CPUs "
        f"({platform.processor() or platform.machine()})."
    )
    table = render(results, title="LoCoMo retrieval recall", note=note, configurations=True)
    if len(conversations) > 1:
        table += "\n## Per conversation\n\n" + render_spread(spreads)
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table, encoding="utf-8")
    if args.json:
        args.json.write_text(json.dumps([r.to_json() for r in results], indent=1))
    return 0


def _run_index(args: argparse.Namespace, conversations: list[Conversation], source: str) -> int:
    from keeper_bench.locomo.rate import measure_rate, render_rates

    load = os.getloadavg()
    modes = {"on": (True,), "off": (False,), "both": (True, False)}[args.sentence_vectors]
    words: list[int | None] = [int(w) for w in args.sentence_words.split(",") if w.strip()]
    loaded: dict[str, tuple[Embedder, float]] = {}
    rows = []
    for name in (n.strip() for n in args.embedders.split(",") if n.strip()):
        for sentence_vectors in modes:
            for sentence_words in (words or [None]) if sentence_vectors else [None]:
                for _ in range(max(args.repeat, 1)):
                    rows.append(
                        measure_rate(
                            name,
                            conversations,
                            sentence_vectors=sentence_vectors,
                            sentence_words=sentence_words,
                            threads=args.threads,
                            loaded=loaded,
                        )
                    )
                    print(render_rates(rows[-1:], note="").splitlines()[-3], flush=True)
    note = (
        f"# Embedding backend indexing rate\n\n{len(conversations)} conversation(s) from "
        f"`{source}`, one message per add, model loaded first; threads "
        f"{args.threads or 'default'}; load average before "
        f"{', '.join(f'{x:.2f}' for x in load)} (1, 5, 15 min) on {os.cpu_count()} CPUs."
    )
    table = render_rates(rows, note=note)
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table, encoding="utf-8")
    return 0


def _conversations(args: argparse.Namespace) -> tuple[list[Conversation], str]:
    if args.data:
        paths: list[Path] = args.data if isinstance(args.data, list) else [args.data]
        conversations = [c for path in paths for c in load_locomo(path)]
        return conversations, ", ".join(path.name for path in paths)
    import tempfile

    from keeper_bench.locomo.streams import conversation_from_stream
    from keeper_bench.run_options import resolve_stream

    seeds = [int(seed) for seed in str(args.seeds).split(",") if seed.strip()]
    folder = Path(tempfile.mkdtemp(prefix="keeper-stream-"))
    conversations = [
        conversation_from_stream(
            resolve_stream(args.stream, folder / f"seed-{seed}", seed=seed),
            name=f"{args.stream} seed {seed}",
        )
        for seed in seeds
    ]
    return conversations, f"{args.stream}, seeds {', '.join(map(str, seeds))}"


def register_commands(register: Callable[[Command], None]) -> None:
    register(
        Command(
            "locomo",
            "LoCoMo (a file you give): retrieval recall, or arms answered by a model",
            _configure,
            _run,
        )
    )
