"""Recall of keyword search in PostgreSQL against the SQLite BM25 backend, on the same passages.

    python -m keeper_bench.postgres_keyword_bench --sizes 10000,100000

The passages are the synthetic counter stories of ``retrievers_bench`` (one session, added one
turn at a time). Every query has a known answer set, so recall needs no judge:

- ``name``: a counter's name alone; relevant = every sentence naming it;
- ``question``: "what did the clerk record for NAME and who took from it" (common words that
  a third of the sentences hold, around one rare name); relevant = sentences naming it;
- ``range``: a name with an item range; relevant = sentences naming it inside the range;
- ``mixed``: "NAME near the gate in the rain", a name among words the filler sentences hold;
  relevant = sentences naming it.

recall@10 = relevant sentences in the top 10 / min(10, relevant sentences), averaged over the
queries of a family. Three rankers read the same passages: the SQLite backend (FTS5 ``bm25()``),
``PostgresKeywordRetriever`` (IDF-weighted terms + ``ts_rank``), and PostgreSQL's own
``ts_rank_cd`` with no IDF (what a plain full-text query would give), to show why the IDF
weighting is there. A throwaway server is started in a temporary folder unless ``--database``
is given. The table is printed and written to ``bench/results/postgres_keyword.md``.
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from keeper_bench.retrievers_bench import _NOUNS, counter_names, story_sentences
from keeper_middleware.retrievers.base import Hit, Passage, Retriever
from keeper_middleware.retrievers.keyword import KeywordRetriever
from keeper_middleware.retrievers.postgres_keyword import PostgresKeywordRetriever

RESULTS = Path(__file__).resolve().parents[1] / "results" / "postgres_keyword.md"
SESSION = "bench"
K = 10
Search = Callable[[str, int | None, int | None], list[int]]
"""(query, from_item, to_item) -> positions of the top K passages."""


@contextmanager
def database(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    from keeper_middleware.integrations.postgres_server import LocalPostgres

    with LocalPostgres() as server:
        yield server.url


def corpus(size: int, turn: int) -> tuple[list[Passage], list[str]]:
    rng = random.Random(size)
    names = counter_names(max(50, size // 500), rng)
    passages = [
        Passage(session=SESSION, item=position // turn, position=position, text=sentence)
        for position, sentence in enumerate(story_sentences(size, names, rng))
    ]
    return passages, names


def queries(
    names: list[str], passages: list[Passage], count: int
) -> list[tuple[str, str, int | None, int | None, set[int]]]:
    """(family, query, from_item, to_item, relevant positions)."""
    rng = random.Random(len(passages))
    holding: dict[str, list[Passage]] = {}
    for p in passages:
        for word in re.findall(r"\w+", p.text):
            if word in names:
                holding.setdefault(word, []).append(p)
    named = sorted(holding)
    last_item = passages[-1].item
    made = []
    for i in range(count):
        name = rng.choice(named)
        family = ("name", "question", "range", "mixed")[i % 4]
        low = high = None
        if family == "range":
            low = rng.randrange(0, max(1, last_item - 200))
            high = low + 200
        text = name
        if family == "question":
            text = f"what did the clerk record for {name} and who took from it"
        elif family == "mixed":
            text = f"{name} near the {rng.choice(_NOUNS)} in the rain"
        relevant = {
            p.position
            for p in holding[name]
            if low is None or high is None or low <= p.item <= high
        }
        if relevant:
            made.append((family, text, low, high, relevant))
    return made


def via_retriever(retriever: Retriever) -> Search:
    def search(query: str, low: int | None, high: int | None) -> list[int]:
        hits: list[Hit] = retriever.search(query, session=SESSION, k=K, from_item=low, to_item=high)
        return [h.passage.position for h in hits]

    return search


def via_ts_rank_cd(retriever: PostgresKeywordRetriever) -> Search:
    """PostgreSQL's ranking as is: the query's words ORed, ordered by ``ts_rank_cd``."""

    def search(query: str, low: int | None, high: int | None) -> list[int]:
        words = [w for w in re.findall(r"\w+", query.lower())]
        either = " || ".join(["plainto_tsquery('english', %s)"] * len(words))
        with retriever._connection() as conn:
            rows = conn.execute(
                f"SELECT position FROM {retriever.schema}.passages, ({'SELECT ' + either}) AS q(q) "
                "WHERE session = %s AND tsv @@ q.q AND item BETWEEN %s AND %s "
                "ORDER BY ts_rank_cd(tsv, q.q) DESC, position DESC LIMIT %s",
                (
                    *words,
                    SESSION,
                    -(2**62) if low is None else low,
                    2**62 if high is None else high,
                    K,
                ),
            ).fetchall()
        return [row[0] for row in rows]

    return search


def measure(
    search: Search, asked: list[tuple[str, str, int | None, int | None, set[int]]]
) -> dict[str, Any]:
    recall: dict[str, list[float]] = {}
    top1: list[float] = []
    latencies = []
    results = []
    for family, text, low, high, relevant in asked:
        begin = time.perf_counter()
        found = search(text, low, high)
        latencies.append((time.perf_counter() - begin) * 1000)
        results.append(found)
        hit = len(relevant & set(found)) / min(K, len(relevant))
        recall.setdefault(family, []).append(hit)
        top1.append(float(bool(found) and found[0] in relevant))
    return {
        "recall": {f: statistics.mean(v) for f, v in recall.items()},
        "top1": statistics.mean(top1),
        "p50": statistics.median(latencies),
        "p95": statistics.quantiles(latencies, n=20)[18],
        "results": results,
    }


def run_size(url: str, size: int, turn: int, count: int) -> list[dict[str, Any]]:
    passages, names = corpus(size, turn)
    asked = queries(names, passages, count)
    schema = f"bench_{size}"
    with tempfile.TemporaryDirectory() as folder:
        sqlite = KeywordRetriever(Path(folder) / "keyword.sqlite3")
        postgres = PostgresKeywordRetriever(url, schema=schema)
        postgres.delete_session(SESSION)
        timings = {}
        for name, retriever in (("sqlite", sqlite), ("postgres", postgres)):
            started = time.perf_counter()
            for start in range(0, len(passages), turn):
                retriever.add(passages[start : start + turn])
            timings[name] = len(passages) / (time.perf_counter() - started)
        rows = []
        bm25 = measure(via_retriever(sqlite), asked)
        for label, search, rate in (
            ("SQLite FTS5 bm25 (KeywordRetriever)", via_retriever(sqlite), timings["sqlite"]),
            (
                "PostgreSQL idf + ts_rank (PostgresKeywordRetriever)",
                via_retriever(postgres),
                timings["postgres"],
            ),
            ("PostgreSQL ts_rank_cd alone (no IDF)", via_ts_rank_cd(postgres), timings["postgres"]),
        ):
            result = measure(search, asked)
            overlap = statistics.mean(
                len(set(a) & set(b)) / max(1, len(set(a) | set(b)))
                for a, b in zip(result["results"], bm25["results"], strict=True)
            )
            rows.append(
                {
                    "ranker": label,
                    "size": size,
                    "queries": len(asked),
                    "add": rate,
                    "overlap": overlap,
                    **result,
                }
            )
        postgres.delete_session(SESSION)
        postgres.close()
        sqlite.close()
    return rows


def render(rows: list[dict[str, Any]], note: str) -> str:
    lines = [
        "# Keyword search in PostgreSQL against SQLite BM25",
        "",
        (__doc__ or "").split("\n\n", 2)[-1].split("A throwaway")[0].strip(),
        "",
        note,
        "",
        "| ranker | sentences | queries | recall@10 name | recall@10 question | recall@10 range | recall@10 mixed | top-1 relevant | overlap with BM25 top 10 (Jaccard) | add (sent/s) | search p50 (ms) | search p95 (ms) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        rec = r["recall"]
        lines.append(
            f"| {r['ranker']} | {r['size']:,} | {r['queries']} | {rec['name']:.3f} | "
            f"{rec['question']:.3f} | {rec['range']:.3f} | {rec['mixed']:.3f} | {r['top1']:.3f} | "
            f"{r['overlap']:.3f} | "
            f"{r['add']:,.0f} | {r['p50']:.2f} | {r['p95']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--turn", type=int, default=50, help="sentences per add() call")
    parser.add_argument("--database", help="a postgresql:// URL (default: a throwaway server)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    with database(args.database) as url:
        for size in (int(s) for s in args.sizes.split(",")):
            rows += run_size(url, size, args.turn, args.queries)
            print(render(rows, ""), flush=True)
    command = "python -m keeper_bench.postgres_keyword_bench " + " ".join(
        argv if argv is not None else [f"--sizes {args.sizes}", f"--queries {args.queries}"]
    )
    note = f"Command: `{command}` ({time.perf_counter() - started:.0f} s in all)."
    table = render(rows, note)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(table)
    print(table)


if __name__ == "__main__":
    main()
