"""Keyword search inside PostgreSQL, so a deployment on one database needs no local files.

Passages live in ``<schema>.passages`` with a ``tsvector`` per sentence (``to_tsvector`` with the
``english`` configuration: stemmed, stopwords dropped; names with digits like ``domo86`` stay one
lexeme) and a GIN index over it; a search ORs the query's words and ranks in SQL.

How the ranking differs from BM25 (the SQLite backend, FTS5 ``bm25()``): PostgreSQL's own
``ts_rank`` knows nothing of how rare a word is across the collection, so a passage that repeats
a common word would outrank the one passage naming the rare counter asked about. The score here
is therefore computed as

    sum over query words w found in the passage of idf(w) + 0.1 * ts_rank(tsv, query, 1)

with ``idf(w) = ln(1 + (N - n + 0.5) / (n + 0.5))`` over the session's N passages, n of them
holding w (counted on the GIN index and cached until the session grows by a quarter). As in the
SQLite backend, words held by more than 5% of the passages are left out of the query while rarer
ones are in it, and come back only when the rarer words give fewer than ``k`` hits; this keeps a
search from ranking a third of the archive because the question said "clerk". Unlike
BM25 it has no term-frequency saturation (a word counts once however often it appears) and length
normalisation only enters the small ``ts_rank`` tie-break (normalisation 1: divided by
1 + log(length)); IDF is per session, where FTS5's is over the whole file. Recall against the
BM25 backend on the same passages is measured in ``bench/results/postgres_keyword.md``.

Text is stored as UTF-8 ``bytea`` (a sentence may hold a NUL, which ``text`` cannot); the
indexed ``tsvector`` is made from the text with NULs replaced.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Iterable, Sequence
from typing import Any, LiteralString, cast

from keeper_middleware.errors import ConfigurationError, InvalidStateError
from keeper_middleware.retrievers.base import (
    Hit,
    MissingExtraError,
    Passage,
    ServerUnavailableError,
    Spans,
    check_search_arguments,
)
from keeper_middleware.retrievers.keyword import query_terms
from keeper_middleware.retrievers.noise import useless_hit
from keeper_middleware.retrievers.passages import STOPWORDS, mark_hits

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_RECOUNT_GROWTH = 1.25
_CACHE_LIMIT = 50_000
_NOISE_MARGIN = 5
"""Rows asked for beyond ``k``, so passages that say nothing can be dropped without a second
query in the usual case."""


def _useful(rows: list[Any], query: str) -> list[Any]:
    """``rows`` less replies that say nothing and the asking question (``retrievers/noise.py``)."""
    return [
        row
        for row in rows
        if not useless_hit(bytes(row[2]).decode("utf-8", "surrogatepass"), query)
    ]


_TIE_BREAK = 0.1
_COMMON_FRACTION = 0.05
_MIN_ITEM = -(2**63)
_MAX_ITEM = 2**63 - 1

_SCHEMA = """
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.passages (
    session TEXT NOT NULL,
    position BIGINT NOT NULL,
    item BIGINT NOT NULL,
    text BYTEA NOT NULL,
    tsv TSVECTOR NOT NULL,
    PRIMARY KEY (session, position)
);
CREATE INDEX IF NOT EXISTS passages_tsv ON {schema}.passages USING GIN (tsv);
CREATE INDEX IF NOT EXISTS passages_item ON {schema}.passages (session, item)
"""

_UPSERT = """
INSERT INTO {schema}.passages (session, position, item, text, tsv)
VALUES (%s, %s, %s, %s, to_tsvector(%s::regconfig, %s))
ON CONFLICT (session, position) DO UPDATE
SET item = excluded.item, text = excluded.text, tsv = excluded.tsv
WHERE passages.item != excluded.item OR passages.text != excluded.text
"""


def _redacted(url: str) -> str:
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


class PostgresKeywordRetriever:
    """Full-text keyword search in PostgreSQL (GIN index, IDF-weighted ranking).

    ``url`` is a ``postgresql://`` URL; the table goes in ``schema`` (the archive's schema by
    default, so one database holds the archive and its index). ``config`` is the text search
    configuration (``english`` stems English; ``simple`` only lowercases, for other languages).
    """

    def __init__(
        self,
        url: str,
        *,
        schema: str = "keeper",
        config: str = "english",
        max_size: int = 5,
        timeout: float = 30.0,
    ) -> None:
        if not _IDENTIFIER.fullmatch(schema):
            raise ConfigurationError(
                f"schema must be a lowercase SQL name like 'keeper', got {schema!r}"
            )
        try:
            import psycopg
            from psycopg_pool import ConnectionPool
        except ImportError as exc:
            raise MissingExtraError(
                "psycopg", "postgres", needed_by="PostgresKeywordRetriever"
            ) from exc
        self._psycopg: Any = psycopg
        self._url = url
        self.schema = schema
        self.config = config
        self._lock = threading.Lock()
        self._term_counts: dict[tuple[str, str], tuple[int, int]] = {}
        self._lexeme_cache: dict[str, str] = {}
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=max(1, round(timeout))) as c:
                with c.transaction():
                    c.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"kw:{schema}",))
                    for statement in _SCHEMA.format(schema=schema).split(";"):
                        # built from a schema name checked against _IDENTIFIER above
                        query: LiteralString = cast(Any, statement)
                        c.execute(query)
                c.execute("SELECT %s::regconfig", (config,))
        except psycopg.errors.UndefinedObject as exc:
            raise ConfigurationError(
                f"config {config!r} is not a text search configuration of the server: use "
                "'english', 'simple' or another listed by \\dF in psql"
            ) from exc
        except psycopg.OperationalError as exc:
            raise ServerUnavailableError(
                f"cannot reach PostgreSQL at {_redacted(url)}: {str(exc).strip()}"
            ) from exc
        self._pool: Any = ConnectionPool(
            url,
            min_size=1,
            max_size=max_size,
            timeout=timeout,
            kwargs={"autocommit": True},
            open=True,
            name=f"keeper-keyword-{schema}",
        )
        self._closed = False

    def _connection(self) -> Any:
        if self._closed:
            raise InvalidStateError(f"{self!r} is closed; make a new one to search again.")
        return self._pool.connection()

    def add(self, passages: Sequence[Passage]) -> None:
        rows = [
            (
                p.session,
                p.position,
                p.item,
                p.text.encode("utf-8", "surrogatepass"),
                self.config,
                p.text.replace("\x00", " "),
            )
            for p in passages
        ]
        if not rows:
            return
        with self._connection() as conn, conn.transaction(), conn.cursor() as cursor:
            cursor.executemany(_UPSERT.format(schema=self.schema), rows)

    def search(
        self,
        query: str,
        *,
        session: str,
        k: int = 10,
        from_item: int | None = None,
        to_item: int | None = None,
        within: Spans | None = None,
    ) -> list[Hit]:
        check_search_arguments(k, from_item, to_item)
        terms = [t for t in query_terms(query) if t not in STOPWORDS] or query_terms(query)
        if not terms or (within is not None and not within):
            return []
        params: dict[str, Any] = {
            "config": self.config,
            "session": session,
            "from_item": _MIN_ITEM if from_item is None else from_item,
            "to_item": _MAX_ITEM if to_item is None else to_item,
            "k": k,
            "tie": _TIE_BREAK,
            "lows": None if within is None else [start for start, _ in within.ranges],
            "highs": None if within is None else [end for _, end in within.ranges],
        }
        with self._connection() as conn:
            total, weights = self._idf(conn, session, terms)
            rare = [(t, w) for t, w, held in weights if held <= total * _COMMON_FRACTION]
            every = [(t, w) for t, w, _ in weights]
            # a few more than asked: replies that say nothing and the question itself are
            # dropped (retrievers/noise.py), as the other keyword engines drop them
            asked = {**params, "k": k + _NOISE_MARGIN}
            found = self._run(conn, rare or every, asked, exclude=[])
            rows = _useful(found, query)
            if len(rows) < k and rare and len(rare) < len(every):
                seen = [position for _, position, *_ in found]
                more = {**params, "k": k - len(rows) + _NOISE_MARGIN}
                rows += _useful(self._run(conn, every, more, exclude=seen), query)
            rows = rows[:k]
            if within is not None:
                rows = [self._next_within(conn, row, session, within) for row in rows]
        # each hit's best sentence marked, as the other retrievers mark theirs (it was left
        # at the first: "»Item 3.« Mira set c3 to 3." where SQLite showed the sentence found)
        hits = [
            Hit(
                passage=Passage(
                    session=session,
                    item=item,
                    position=position,
                    text=bytes(text).decode("utf-8", "surrogatepass"),
                ),
                score=float(score),
                next_text=(
                    "" if following is None else bytes(following).decode("utf-8", "surrogatepass")
                ),
            )
            for item, position, text, score, following in rows
        ]
        return mark_hits(hits, query)

    def _run(
        self,
        conn: Any,
        weights: list[tuple[str, float]],
        params: dict[str, Any],
        exclude: list[int],
    ) -> list[tuple[Any, ...]]:
        """The top ``k`` passages matching any of the words, by IDF-weighted words held."""
        if not weights:
            return []
        # the tsqueries go in as values, not expressions, so the planner uses the GIN index
        held = " + ".join(
            f"(p.tsv @@ %(q{i})s::tsquery)::int * %(w{i})s" for i in range(len(weights))
        )
        bound = dict(params, exclude=exclude)
        for i, (lexemes, weight) in enumerate(weights):
            bound[f"q{i}"], bound[f"w{i}"] = lexemes, weight
        bound["q"] = " | ".join(f"({lexemes})" for lexemes, _ in weights)
        rows: list[tuple[Any, ...]] = conn.execute(
            f"""
            SELECT p.item, p.position, p.text,
                   {held} + %(tie)s * ts_rank(p.tsv, %(q)s::tsquery, 1) AS score,
                   n.text
            FROM {self.schema}.passages AS p
            LEFT JOIN {self.schema}.passages AS n
                ON n.session = p.session AND n.position = p.position + 1
            WHERE p.session = %(session)s AND p.tsv @@ %(q)s::tsquery
              AND p.item BETWEEN %(from_item)s AND %(to_item)s
              AND NOT (p.position = ANY(%(exclude)s))
              AND (%(lows)s::bigint[] IS NULL OR EXISTS (
                  SELECT 1 FROM unnest(%(lows)s::bigint[], %(highs)s::bigint[]) AS s(low, high)
                  WHERE p.position >= s.low AND p.position < s.high))
            ORDER BY score DESC, p.position DESC
            LIMIT %(k)s
            """,
            bound,
        ).fetchall()
        return rows

    def _next_within(
        self, conn: Any, row: tuple[Any, ...], session: str, within: Spans
    ) -> tuple[Any, ...]:
        """The row with the passage that follows it within the spans (the next one of the same
        branch), where the next position belongs to another branch."""
        item, position, text, score, _ = row
        if within.following(position) == position + 1:
            return row
        following = within.following(position)
        found = (
            None
            if following is None
            else conn.execute(
                f"SELECT text FROM {self.schema}.passages WHERE session = %s AND position = %s",
                (session, following),
            ).fetchone()
        )
        return (item, position, text, score, None if found is None else found[0])

    def _idf(
        self, conn: Any, session: str, terms: list[str]
    ) -> tuple[int, list[tuple[str, float, int]]]:
        """The session's passage count and (term, idf, passages holding it) for held terms.

        Positions grow from 0 as passages arrive, so the highest one bounds the count without
        reading every row.
        """
        row = conn.execute(
            f"SELECT COALESCE(MAX(position) + 1, 0) FROM {self.schema}.passages WHERE session = %s",
            (session,),
        ).fetchone()
        total = int(row[0])
        weighted = []
        for term in terms:
            lexemes = self._lexemes(conn, term)
            held = self._passages_with(conn, session, lexemes, total) if lexemes else 0
            if held:
                weighted.append((lexemes, math.log(1 + (total - held + 0.5) / (held + 0.5)), held))
        return total, weighted

    def _lexemes(self, conn: Any, term: str) -> str:
        """The word as a tsquery in text form ('' for a word the configuration drops)."""
        with self._lock:
            known = self._lexeme_cache.get(term)
        if known is None:
            row = conn.execute(
                "SELECT plainto_tsquery(%s::regconfig, %s)::text", (self.config, term)
            ).fetchone()
            known = str(row[0])
            with self._lock:
                if len(self._lexeme_cache) > _CACHE_LIMIT:
                    self._lexeme_cache.clear()
                self._lexeme_cache[term] = known
        return known

    def _passages_with(self, conn: Any, session: str, lexemes: str, total: int) -> int:
        with self._lock:
            cached = self._term_counts.get((session, lexemes))
        if cached is not None and cached[0] and total <= cached[1] * _RECOUNT_GROWTH:
            return cached[0]  # a word seen in no passage is counted again: it may be new
        count = int(
            conn.execute(
                f"SELECT COUNT(*) FROM {self.schema}.passages WHERE session = %s "
                "AND tsv @@ %s::tsquery",
                (session, lexemes),
            ).fetchone()[0]
        )
        with self._lock:
            if len(self._term_counts) > _CACHE_LIMIT:
                self._term_counts.clear()
            self._term_counts[(session, lexemes)] = (count, total)
        return count

    def passages_at(self, session: str, positions: Iterable[int]) -> list[Passage]:
        """The session's stored passages at these positions (those it holds), in order: the
        hybrid's reply window reads the passages after its hits here (the table keeps no
        context, so they come without one)."""
        wanted = sorted({int(p) for p in positions})
        if not wanted:
            return []
        with self._connection() as conn:
            rows = conn.execute(
                f"SELECT item, position, text FROM {self.schema}.passages "
                "WHERE session = %s AND position = ANY(%s) ORDER BY position",
                (session, wanted),
            ).fetchall()
        return [
            Passage(
                session=session,
                item=int(item),
                position=int(position),
                text=bytes(text).decode("utf-8", "surrogatepass"),
            )
            for item, position, text in rows
        ]

    def count(self, session: str) -> int:
        with self._connection() as conn:
            row = conn.execute(
                f"SELECT COUNT(*) FROM {self.schema}.passages WHERE session = %s", (session,)
            ).fetchone()
        return int(row[0])

    def delete_session(self, session: str) -> None:
        with self._connection() as conn:
            conn.execute(f"DELETE FROM {self.schema}.passages WHERE session = %s", (session,))
        with self._lock:
            self._term_counts = {k: v for k, v in self._term_counts.items() if k[0] != session}

    def flush(self) -> None:
        """Nothing to wait for: every add is committed and indexed before it returns."""

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._pool.close()

    def __repr__(self) -> str:
        return f"PostgresKeywordRetriever({_redacted(self._url)!r}, schema={self.schema!r})"
