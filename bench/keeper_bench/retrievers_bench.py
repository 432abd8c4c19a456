"""Measures the retrieval backends on synthetic counter-story sentences.

    python -m keeper_bench.retrievers_bench --sizes 100000,1000000 \\
        --backends keyword,embedding,hybrid

Each (backend, size) runs in a fresh subprocess, so peak memory (``ru_maxrss``) is its own.
Passages are added one turn at a time (``--turn`` sentences per ``add``), as the keeper archives
them. Embedding runs ~500 sentences/s on 2 cores, so embedding and hybrid sizes are capped at
``--max-embedding-size`` and the table says so. The table is printed and written to
``bench/results/retrievers.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from keeper_middleware.retrievers.base import Passage
from keeper_middleware.retrievers.embedders import (
    Embedder,
    embed_query,
    embedder_from_name,
    embedder_name,
)
from keeper_middleware.retrievers.embedding import EmbeddingRetriever
from keeper_middleware.retrievers.factory import make_retriever

RESULTS = Path(__file__).resolve().parents[1] / "results" / "retrievers.md"
SESSION = "bench"
_SYLLABLES = ["do", "mo", "ka", "ri", "ven", "tal", "os", "pe", "lun", "zar", "mi", "ko"]
_PEOPLE = ["Mira", "The clerk", "Old Tomas", "The miller", "Ines", "A courier", "Berit"]
_FILLER = [
    "The rain kept on.",
    "A cart rolled past the {noun}.",
    "Someone laughed near the {noun}.",
    "The {noun} smelled of smoke and wet wool.",
    "Nobody spoke for a while.",
    "The lamps were lit early that evening near the {noun}.",
]
_NOUNS = ["gate", "mill", "river", "market", "well", "granary", "harbour", "chapel"]
_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "  # noqa: SIM905
    "fifteen sixteen seventeen eighteen nineteen".split()
)
_TENS = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def number_words(n: int) -> str:
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else "-" + _ONES[n % 10])
    rest = n % 100
    return f"{_ONES[n // 100]} hundred" + ("" if rest == 0 else f" and {number_words(rest)}")


def counter_names(count: int, rng: random.Random) -> list[str]:
    names: set[str] = set()
    while len(names) < count:
        names.add(rng.choice(_SYLLABLES) + rng.choice(_SYLLABLES) + str(rng.randrange(10, 100)))
    return sorted(names)


def story_sentences(total: int, names: list[str], rng: random.Random) -> Iterator[str]:
    """Counter stories: records, changes that say "it", and filler."""
    while total > 0:
        name = rng.choice(names)
        kind = rng.random()
        if kind < 0.35:
            batch = [
                f"The clerk recorded {name} at {number_words(rng.randrange(1, 1000))}.",
                f"{number_words(rng.randrange(1, 20)).capitalize()} were taken from it.",
            ]
        elif kind < 0.6:
            batch = [f"{rng.choice(_PEOPLE)} added {number_words(rng.randrange(1, 50))} to {name}."]
        else:
            batch = [rng.choice(_FILLER).format(noun=rng.choice(_NOUNS))]
        yield from batch[:total]
        total -= len(batch)


def bench_queries(names: list[str], rng: random.Random, items: int) -> list[dict[str, object]]:
    """100 queries: names alone, names in a question, common words, and item-range filters."""
    queries: list[dict[str, object]] = []
    for i in range(100):
        name = rng.choice(names)
        if i % 10 < 5:
            text = name
        elif i % 10 < 8:
            text = f"what did the clerk record for {name} and who took from it"
        else:
            text = f"what happened at the {rng.choice(_NOUNS)} in the rain"
        query: dict[str, object] = {"query": text}
        if i % 4 == 3:
            low = rng.randrange(0, max(1, items - 50))
            query |= {"from_item": low, "to_item": low + 50}
        queries.append(query)
    return queries


_QUESTIONS = [
    "What did {person} add to {name} after the cart rolled past the {noun}?",
    "How many were taken from {name} when the clerk recorded it?",
    "Who added {number} to {name} near the {noun}?",
    "What was {name} recorded at, and what happened at the {noun} that evening?",
    "Did anyone laugh near the {noun} while {person} counted {name}?",
    "Which counter did {person} change at the {noun} before the lamps were lit?",
]


def bench_questions(names: list[str], rng: random.Random, count: int) -> list[dict[str, object]]:
    """Whole questions as an agent's question set holds them: a name among common words."""
    return [
        {
            "query": rng.choice(_QUESTIONS).format(
                person=rng.choice(_PEOPLE),
                name=rng.choice(names),
                noun=rng.choice(_NOUNS),
                number=number_words(rng.randrange(1, 50)),
            )
        }
        for _ in range(count)
    ]


def run_one(
    backend: str,
    size: int,
    turn: int,
    folder: Path,
    queries: str = "mixed",
    embedder: str | None = None,
    per_unit: int = 1,
    sentence_vectors: bool = True,
    *,
    built: bool = False,
    query_embedder: str | None = None,
) -> dict[str, object]:
    """``size`` passages of ``per_unit`` sentences each (3 stands for a chat message).

    ``built``: the folder already holds this index (``--keep``), so only the searches run (the
    stories are still generated, so the queries are the same as when it was built)."""
    rng = random.Random(size)
    names = counter_names(max(50, size // 500), rng)
    chosen_embedder = embedder_from_name(embedder) if embedder else None
    if query_embedder:
        chosen_embedder = QueryModelEmbedder(
            chosen_embedder or embedder_from_name("minilm"), embedder_from_name(query_embedder)
        )
        chosen_embedder(["The query model loads before the clock starts."])
        embed_query(chosen_embedder, "The query model loads before the clock starts.")
    retriever = (
        make_retriever(backend, path=folder, embedder=chosen_embedder)
        if sentence_vectors or backend != "embedding"
        else EmbeddingRetriever(folder / "chroma", embedder=chosen_embedder, sentence_vectors=False)
    )
    started, started_cpu = time.perf_counter(), time.process_time()
    batch: list[Passage] = []
    item = 0
    for position, sentence in enumerate(
        _units(story_sentences(size * per_unit, names, rng), per_unit)
    ):
        batch.append(Passage(session=SESSION, item=item, position=position, text=sentence))
        if len(batch) == turn:
            if not built:
                retriever.add(batch)
            batch, item = [], item + 1
    if not built:
        retriever.add(batch)
    returned = time.perf_counter() - started
    retriever.flush()
    added = time.perf_counter() - started
    added_cpu = time.process_time() - started_cpu
    latencies, cpu = [], []
    chosen = (
        bench_questions(names, rng, 1_000)
        if queries == "questions"
        else bench_queries(names, rng, item)
    )
    for query in chosen:
        begin, begin_cpu = time.perf_counter(), time.process_time()
        retriever.search(str(query.pop("query")), session=SESSION, k=10, **query)  # type: ignore[arg-type]
        latencies.append((time.perf_counter() - begin) * 1000)
        cpu.append((time.process_time() - begin_cpu) * 1000)
    retriever.close()
    quantiles = statistics.quantiles(latencies, n=100)
    return {
        "backend": backend,
        "size": size,
        "built_before": built,
        "add_per_s": size / added,
        "add_per_cpu_s": size / added_cpu if added_cpu else 0.0,
        "add_returned_s": returned,
        "add_total_s": added,
        "p50_ms": statistics.median(latencies),
        "p95_ms": quantiles[94],
        "cpu_p95_ms": statistics.quantiles(cpu, n=100)[94],
        "queries": len(chosen),
        "disk_mb": sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


class QueryModelEmbedder:
    """Index vectors from one embedder, query vectors from a model: fills a large index fast
    (``--embedder hashing``) while each search still pays for embedding its query with a real
    model. The collection records the index embedder's name."""

    def __init__(self, index: Embedder, query: Embedder) -> None:
        self._index = index
        self._query = query
        self.name = embedder_name(index)

    def __call__(self, texts: list[str]) -> list[list[float]]:
        return self._index(texts)

    def embed_query(self, text: str) -> list[float]:
        return embed_query(self._query, text)


def _units(sentences: Iterator[str], per_unit: int) -> Iterator[str]:
    unit: list[str] = []
    for sentence in sentences:
        unit.append(sentence)
        if len(unit) == per_unit:
            yield " ".join(unit)
            unit = []
    if unit:
        yield " ".join(unit)


def render(rows: list[dict[str, object]], note: str) -> str:
    lines = [
        "# Retriever benchmark",
        "",
        "Synthetic counter-story passages in one session, added one turn at a time, k=10. Queries",
        "`mixed`: 100 (names, questions naming a counter, common words; a quarter with an item",
        "range); `questions`: 1,000 whole questions naming a counter among common words.",
        note,
        "",
        "| backend | passages | add (passages/s) | add (passages per CPU-s) | add returns after (s) | indexed after (s) | queries | search p50 (ms) | search p95 (ms) | search CPU p95 (ms) | index on disk (MB) | peak RSS (MB) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r.get("built_before"):
            adding = "| built before | built before | – | – |"
        else:
            adding = (
                f"| {r['add_per_s']:,.0f} | {r.get('add_per_cpu_s', float('nan')):,.0f} "
                f"| {r['add_returned_s']:.1f} | {r['add_total_s']:.1f} |"
            )
        lines.append(
            f"| {r['backend']} | {r['size']:,} {adding}"
            f" {r.get('queries', 100)} | {r['p50_ms']:.2f} | {r['p95_ms']:.2f} "
            f"| {r.get('cpu_p95_ms', float('nan')):.2f} "
            f"| {r['disk_mb']:.1f} | {r['peak_rss_mb']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def _index_name(args: argparse.Namespace, backend: str, size: int) -> str:
    """One folder per index a set of options builds (the query embedder is not part of it)."""
    one = "-onevector" if args.one_vector and backend == "embedding" else ""
    embedder = "" if backend == "keyword" else f"-{args.embedder or 'minilm'}{one}"
    return f"{backend}-{size}-per{args.per_passage}-turn{args.turn}{embedder}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--backends", default="keyword,embedding,hybrid")
    parser.add_argument("--turn", type=int, default=50, help="sentences per add() call")
    parser.add_argument("--max-embedding-size", type=int, default=100_000)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument(
        "--queries",
        choices=("mixed", "questions"),
        default="mixed",
        help="mixed: 100 names, questions and ranges; questions: 1,000 whole questions",
    )
    parser.add_argument(
        "--embedder",
        default=None,
        help="embedding and hybrid: minilm (default), minilm-int8, e5-small or hashing (no "
        "model: fills a large index fast to time the search itself)",
    )
    parser.add_argument(
        "--per-passage",
        type=int,
        default=1,
        help="sentences per passage (1: sentence passages; 3: about one chat message each)",
    )
    parser.add_argument(
        "--one-vector",
        action="store_true",
        help="embedding: one vector per passage, not also one per sentence of a message",
    )
    parser.add_argument(
        "--query-embedder",
        default=None,
        help="embed queries with this model while the index's vectors come from --embedder "
        "(e.g. --embedder hashing --query-embedder minilm: a large index fast, real query cost)",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        default=None,
        help="build each index once in this folder (outside the repository) and reuse it: a "
        "later run with the same options times the searches only",
    )
    parser.add_argument("--child", nargs=2, metavar=("BACKEND", "SIZE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        with tempfile.TemporaryDirectory() as scratch:
            folder, built = Path(scratch), False
            if args.keep is not None:
                folder = args.keep / _index_name(args, args.child[0], int(args.child[1]))
                built = (folder / "built").exists()
            result = run_one(
                args.child[0],
                int(args.child[1]),
                args.turn,
                folder,
                args.queries,
                args.embedder,
                args.per_passage,
                not args.one_vector,
                built=built,
                query_embedder=args.query_embedder,
            )
            if args.keep is not None:
                (folder / "built").touch()
        print(json.dumps(result))
        return
    load_before = os.getloadavg()
    rows: list[dict[str, object]] = []
    capped: list[str] = []
    for backend in args.backends.split(","):
        for size in (int(s) for s in args.sizes.split(",")):
            if backend != "keyword" and size > args.max_embedding_size:
                capped.append(f"{backend} at {size:,}")
                size = args.max_embedding_size
                if any(r["backend"] == backend and r["size"] == size for r in rows):
                    continue
            command = [sys.executable, "-m", __spec__.name, "--child", backend, str(size)]
            done = subprocess.run(
                [
                    *command,
                    *("--turn", str(args.turn), "--queries", args.queries),
                    *("--per-passage", str(args.per_passage)),
                    *(("--embedder", args.embedder) if args.embedder else ()),
                    *(("--one-vector",) if args.one_vector else ()),
                    *(("--query-embedder", args.query_embedder) if args.query_embedder else ()),
                    *(("--keep", str(args.keep)) if args.keep else ()),
                ],
                check=True,
                capture_output=True,
                text=True,
            )
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(render(rows[-1:], "").splitlines()[-1], flush=True)
    note = (
        f"Not run (too slow for embedding here, capped at {args.max_embedding_size:,}): {', '.join(capped)}."
        if capped
        else ""
    )
    loads = ", ".join(f"{x:.1f}" for x in load_before)
    after = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    note = (
        f"{note}\nLoad average (1, 5, 15 min) before: {loads}; after: {after}; "
        f"{os.cpu_count()} CPUs. Queries: {args.queries}. "
        f"Embedder: {args.embedder or 'minilm'}"
        f"{f' (queries: {args.query_embedder})' if args.query_embedder else ''}. Sentences per passage: {args.per_passage}"
        f"{' (one vector each)' if args.one_vector else ''}."
    ).strip()
    table = render(rows, note)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(table)
    print(table)


if __name__ == "__main__":
    main()
