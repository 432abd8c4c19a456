"""The default backend: BM25 over SQLite FTS5, with no dependency beyond the standard library.

Passages live in a plain table (``kw_passages``) and an external-content FTS5 index
(``kw_fts``, over the text and the passage's context: speaker, date) kept in step by triggers, so adding is incremental and the tables can share the
archive's SQLite file. The tokenizer is ``porter unicode61 remove_diacritics 2``: names with
digits (``domo86``) stay one token and are found by exact query, while "recorded" also finds
"record". FTS5's ``bm25()`` uses k1=1.2, b=0.75 and its own IDF, ``log((N - n + 0.5) / (n +
0.5))`` floored at a tiny positive number, so a term in more than half the passages adds almost
nothing (rank-bm25's Okapi floors such terms at a fraction of the mean IDF instead); the top
results agree with rank-bm25 on a corpus whose ordering is unambiguous (tested).

Speed (measured p95 in bench/results/retrievers.md): FTS5 scores every row that matches any
query term, so three bounds keep a search fast at a million sentences:

- Common words are dropped first: stop words (``passages.STOPWORDS``: question words too, since
  whole questions are queries), and words found in more than
  ``_COMMON_TERM_FRACTION`` of the passages (they add almost nothing to BM25). They come back
  (stopwords still left out) only when the rarer words give fewer than ``k`` hits. A word in
  more than ``_USELESS_TERM_FRACTION`` of them is not ranked by even then: FTS5 gives it an IDF
  of almost zero, yet counts its whole list for ``bm25()``, and, matching nearly every passage,
  it would fill the newest candidates with passages that match nothing else (measured at 1M
  chat messages: 150-360 ms a search with "about", in every message, among the words;
  bench/results/index_cost.md). Its newest matches only fill up a list still short, unranked.
- Only the newest ``_CANDIDATES`` rows matching the words are ranked. A word in more passages
  than that (a counter named thousands of times) is ranked among its newest mentions; older ones
  are reached with ``from_item``/``to_item``. When filters leave fewer than ``k`` of those
  candidates, the search is run again over every match, so a filter never hides a hit.
- An item range is turned into the range of row ids it can hold, so FTS5 reads only that part
  of each word's list.

Adding stays the same price as the index grows: every add is one transaction, which FTS5 writes
as a new segment and then merges into bigger ones. With its default (merge 4 segments of a
level), a 10M-token conversation's 800K sentences cost 5-19% more CPU an add in the last tenth
than in the first; merging 16 at a time (``_AUTOMERGE``) does a tenth less work in all and stays
within 4-6%, at the same search p95 (8.7-8.9 ms against 8.6-9.1 ms over those sentences,
``bench/results/notes_cost.md``).
"""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from os import PathLike
from pathlib import Path

from keeper_middleware.errors import ArchiveError, ConfigurationError, InvalidStateError
from keeper_middleware.errors.sqlite import FileConnection
from keeper_middleware.retrievers.base import Hit, Passage, Spans, check_search_arguments
from keeper_middleware.retrievers.named_context import POOL, fuse_pool, may_name
from keeper_middleware.retrievers.noise import useless_hit
from keeper_middleware.retrievers.passages import STOPWORDS, mark_hits, refers_back

_TOKEN = re.compile(r"\w+", re.UNICODE)
_COMMON_TERM_FRACTION = 0.05
_USELESS_TERM_FRACTION = 0.5
_CANDIDATES = 2_000
_RANGE_SCAN = 20_000
_TOKENIZER = "porter unicode61 remove_diacritics 2"
_PLAIN_TOKENIZER = "unicode61 remove_diacritics 2"
_AUTOMERGE = 16

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kw_passages (
    id INTEGER PRIMARY KEY,
    session TEXT NOT NULL,
    item INTEGER NOT NULL,
    position INTEGER NOT NULL,
    text TEXT NOT NULL,
    context TEXT NOT NULL DEFAULT '',
    UNIQUE (session, position)
);
CREATE INDEX IF NOT EXISTS kw_passages_item ON kw_passages (session, item, id);
CREATE VIRTUAL TABLE IF NOT EXISTS kw_fts USING fts5(
    text, context, content='kw_passages', content_rowid='id',
    tokenize='{tokenizer}'
);
CREATE VIRTUAL TABLE IF NOT EXISTS kw_vocab USING fts5vocab(kw_fts, 'row');
CREATE TRIGGER IF NOT EXISTS kw_passages_ai AFTER INSERT ON kw_passages BEGIN
    INSERT INTO kw_fts (rowid, text, context) VALUES (new.id, new.text, new.context);
END;
CREATE TRIGGER IF NOT EXISTS kw_passages_ad AFTER DELETE ON kw_passages BEGIN
    INSERT INTO kw_fts (kw_fts, rowid, text, context)
    VALUES ('delete', old.id, old.text, old.context);
END;
CREATE TRIGGER IF NOT EXISTS kw_passages_au AFTER UPDATE ON kw_passages BEGIN
    INSERT INTO kw_fts (kw_fts, rowid, text, context)
    VALUES ('delete', old.id, old.text, old.context);
    INSERT INTO kw_fts (rowid, text, context) VALUES (new.id, new.text, new.context);
END;
"""

_UPSERT = """
INSERT INTO kw_passages (session, item, position, text, context) VALUES (?, ?, ?, ?, ?)
ON CONFLICT (session, position) DO UPDATE
SET item = excluded.item, text = excluded.text, context = excluded.context
WHERE kw_passages.item != excluded.item OR kw_passages.text != excluded.text
    OR kw_passages.context != excluded.context
"""

_SEARCH = """
WITH candidates AS MATERIALIZED (
    SELECT rowid AS id, {score} AS bm25 FROM kw_fts
    WHERE kw_fts MATCH :match AND rowid BETWEEN :low_id AND :high_id
    ORDER BY rowid DESC LIMIT :candidates
)
SELECT p.item, p.position, p.text, -c.bm25 AS score, COALESCE(n.text, ''), p.context
FROM candidates AS c
CROSS JOIN kw_passages AS p ON p.id = c.id
LEFT JOIN kw_passages AS n ON n.session = p.session AND n.position = p.position + 1
WHERE p.session = :session AND p.item BETWEEN :from_item AND :to_item {exclude} {within}
ORDER BY score DESC, p.position DESC
LIMIT :k
"""

_ID_RANGE = """
SELECT MIN(id), MAX(id), COUNT(*) FROM (
    SELECT id FROM kw_passages
    WHERE session = :session AND item BETWEEN :from_item AND :to_item LIMIT :scan
)
"""
"""Bounds the ids an item range can hold, so FTS5 reads only that part of each word's list."""

_UPGRADE = """
ALTER TABLE kw_passages ADD COLUMN context TEXT NOT NULL DEFAULT '';
DROP TRIGGER IF EXISTS kw_passages_ai;
DROP TRIGGER IF EXISTS kw_passages_ad;
DROP TRIGGER IF EXISTS kw_passages_au;
DROP TABLE IF EXISTS kw_vocab;
DROP TABLE IF EXISTS kw_fts;
"""
"""Brings a file written before passages had a context up to date (its index is rebuilt)."""

_MIN_ITEM = -(2**63)
_MAX_ITEM = 2**63 - 1
CHAIN_MORE = 3
"""The most passages shown after a hit's next one, while they go on speaking of it."""


def query_terms(query: str) -> list[str]:
    """The distinct lowercase word tokens of free text, in order of first appearance."""
    seen: dict[str, None] = {}
    for token in _TOKEN.findall(query.lower()):
        seen.setdefault(token, None)
    return list(seen)


def _within_clause(within: Spans) -> tuple[str, dict[str, object]]:
    """The SQL that keeps a passage within the spans, and its parameters."""
    parts = []
    bounds: dict[str, object] = {}
    for index, (start, end) in enumerate(within.ranges):
        parts.append(f"(p.position >= :w{index}a AND p.position < :w{index}b)")
        bounds[f"w{index}a"], bounds[f"w{index}b"] = start, end
    return f"AND ({' OR '.join(parts)})", bounds


def match_expression(terms: Sequence[str]) -> str:
    """An FTS5 MATCH string that ORs every term, each quoted so no word acts as an operator."""
    return " OR ".join('"' + term.replace('"', '""') + '"' for term in terms)


class KeywordRetriever:
    """BM25 keyword search over SQLite FTS5; incremental, persistent, safe across threads."""

    counts_stored = True
    """``count`` reads the index (so a deleted one is rebuilt: ``indexing.reconcile``)."""

    def __init__(
        self,
        path: str | PathLike[str] = ":memory:",
        *,
        stemming: bool = True,
        stopwords: frozenset[str] = STOPWORDS,
        named_context: bool = True,
    ) -> None:
        """``stemming`` (Porter, so "recorded" finds "record") is fixed when a file is made;
        ``stopwords`` are left out of a query unless nothing else is left; ``named_context``:
        the passages of the speakers, months and years a query names rise among the
        candidates (``retrievers/named_context.py``)."""
        self._named_context = named_context
        location = str(path)
        if location != ":memory:":
            Path(location).parent.mkdir(parents=True, exist_ok=True)
        self._path = location
        self._lock = threading.Lock()
        self._stopwords = stopwords
        tokenizer = _TOKENIZER if stemming else _PLAIN_TOKENIZER
        try:
            # its failures (a full disk, a damaged page) are ArchiveErrors naming the file
            db = sqlite3.connect(
                location, check_same_thread=False, isolation_level=None, factory=FileConnection
            )
            db.name_file(location, "the keyword index")
            self._db: sqlite3.Connection = db
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._upgrade()
            self._db.executescript(_SCHEMA.format(tokenizer=tokenizer))
            self._merge_in_larger_steps()
        except (sqlite3.Error, ArchiveError) as error:
            raise ArchiveError(
                f"cannot open the keyword index {location!r} ({error}); the archive beside it is "
                "untouched: restore this file, or move it away (a new index holds only the turns "
                "archived from then on)"
            ) from error
        self._check_tokenizer(location, tokenizer)
        self._term_counts: dict[str, tuple[int, int]] = {}
        self._closed = False

    def add(self, passages: Sequence[Passage]) -> None:
        rows = [(p.session, p.item, p.position, p.text, p.context) for p in passages]
        if not rows:
            return
        with self._lock:
            self._check_open()
            self._db.execute("BEGIN")
            try:
                self._db.executemany(_UPSERT, rows)
            except BaseException:
                if self._db.in_transaction:  # a full disk has rolled it back already
                    self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

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
        terms = query_terms(query)
        if not terms or (within is not None and not within):
            return []
        params: dict[str, object] = {
            "session": session,
            "from_item": _MIN_ITEM if from_item is None else from_item,
            "to_item": _MAX_ITEM if to_item is None else to_item,
            "k": k,
        }
        clause = ""
        if within is not None:
            clause, bounds = _within_clause(within)
            params |= bounds
        with self._lock:
            self._check_open()
            params |= self._id_range(params, narrow=from_item is not None or to_item is not None)
            if params["low_id"] is None:
                return []
            deep = self._named_context and may_name(query)
            wanted = max(k, POOL) if deep else k
            asked = wanted
            while True:
                found = self._rows(terms, {**params, "k": asked}, clause)
                rows = [row for row in found if not useless_hit(row[2], query)]
                if len(rows) >= wanted or len(found) < asked:
                    break
                asked += len(found) - len(rows)  # replies that say nothing were dropped
            rows = rows[:wanted]
            if within is not None:
                rows = [self._next_within(row, session, within) for row in rows]
            rows = [self._chained(row, session, within) for row in rows]
        hits = [
            Hit(
                passage=Passage(
                    session=session, item=item, position=position, text=text, context=context
                ),
                score=float(score),
                next_text=next_text,
            )
            for item, position, text, score, next_text, context in rows
        ]
        if deep:
            hits = fuse_pool(query, hits, k=k)
        return mark_hits(hits, query)

    def _rows(self, terms: list[str], params: dict[str, object], clause: str) -> list[tuple]:  # type: ignore[type-arg]
        """The best ``params["k"]`` rows: the rare words ranked first, then the wider words,
        then the newest matches of the commonest words fill a list still short."""
        k = int(str(params["k"]))
        wider, filler = self._useful_terms(terms)
        rare = self._rare_terms(terms) or [t for t in terms if t not in filler]
        rows = self._run(rare, params, exclude=[], within=clause)
        for more, scored in ((wider, True), (filler, False)):
            if len(rows) >= k or not more or set(more) <= set(rare):
                continue
            found = [position for _, position, *_ in rows]
            bound = {**params, "k": k - len(rows)}
            rows += self._run(more, bound, exclude=found, within=clause, scored=scored)
        return rows

    def passages_at(self, session: str, positions: Iterable[int]) -> list[Passage]:
        """The session's stored passages at these positions (those it holds), in order: the
        hybrid's reply window reads the passages after its hits here."""
        wanted = sorted({int(p) for p in positions})
        if not wanted:
            return []
        marks = ",".join("?" * len(wanted))
        with self._lock:
            self._check_open()
            rows = self._db.execute(
                "SELECT item, position, text, context FROM kw_passages "
                f"WHERE session = ? AND position IN ({marks}) ORDER BY position",
                (session, *wanted),
            ).fetchall()
        return [
            Passage(session=session, item=item, position=position, text=text, context=context)
            for item, position, text, context in rows
        ]

    def count(self, session: str) -> int:
        with self._lock:
            self._check_open()
            row = self._db.execute(
                "SELECT COUNT(*) FROM kw_passages WHERE session = ?", (session,)
            ).fetchone()
        return int(row[0])

    def delete_session(self, session: str) -> None:
        with self._lock:
            self._check_open()
            self._db.execute("DELETE FROM kw_passages WHERE session = ?", (session,))

    def flush(self) -> None:
        """Nothing to wait for: every add is indexed before it returns."""

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._db.close()

    def __repr__(self) -> str:
        return f"KeywordRetriever({self._path!r})"

    def _upgrade(self) -> None:
        columns = [row[1] for row in self._db.execute("PRAGMA table_info(kw_passages)")]
        if columns and "context" not in columns:
            self._db.executescript(_UPGRADE)
            self._db.executescript(_SCHEMA.format(tokenizer=_TOKENIZER))
            self._db.execute("INSERT INTO kw_fts (kw_fts) VALUES ('rebuild')")

    def _merge_in_larger_steps(self) -> None:
        """Sets FTS5's ``automerge`` (stored in the index, so files made before get it too)."""
        stored = self._db.execute("SELECT v FROM kw_fts_config WHERE k = 'automerge'").fetchone()
        if stored is None or int(stored[0]) != _AUTOMERGE:
            self._db.execute(
                "INSERT INTO kw_fts (kw_fts, rank) VALUES ('automerge', ?)", (_AUTOMERGE,)
            )

    def _check_tokenizer(self, location: str, tokenizer: str) -> None:
        row = self._db.execute("SELECT sql FROM sqlite_master WHERE name = 'kw_fts'").fetchone()
        if row is not None and f"tokenize='{tokenizer}'" not in row[0]:
            self._db.close()
            raise ConfigurationError(
                f"{location} was indexed with another tokenizer than {tokenizer!r}: open it "
                "with the stemming setting it was made with, or use another file."
            )

    def _id_range(self, params: dict[str, object], *, narrow: bool) -> dict[str, object]:
        everything: dict[str, object] = {"low_id": _MIN_ITEM, "high_id": _MAX_ITEM}
        if not narrow:
            return everything
        low, high, rows = self._db.execute(_ID_RANGE, {**params, "scan": _RANGE_SCAN}).fetchone()
        return everything if rows >= _RANGE_SCAN else {"low_id": low, "high_id": high}

    def _rare_terms(self, terms: list[str]) -> list[str]:
        """The words few passages contain (none when there are none; a single word is rare)."""
        if len(terms) < 2:
            return terms
        total = self._db.execute("SELECT COALESCE(MAX(id), 0) FROM kw_passages").fetchone()[0]
        limit = total * _COMMON_TERM_FRACTION
        rare = [
            t for t in terms if t not in self._stopwords and self._passages_with(t, total) <= limit
        ]
        return rare

    def _useful_terms(self, terms: list[str]) -> tuple[list[str], list[str]]:
        """The words worth ranking by (no stopwords, unless nothing else is left), and those
        of them in more than half the passages, which only fill up a short list unranked
        (their IDF is almost zero; see the module docstring), unless nothing else is left."""
        kept = [t for t in terms if t not in self._stopwords] or terms
        if len(kept) < 2:
            return kept, []
        total = self._db.execute("SELECT COALESCE(MAX(id), 0) FROM kw_passages").fetchone()[0]
        limit = total * _USELESS_TERM_FRACTION
        useful = [t for t in kept if self._passages_with(t, total) <= limit]
        if not useful:
            return kept, []
        return useful, [t for t in kept if t not in useful]

    def _passages_with(self, term: str, total: int) -> int:
        """How many passages hold the term, counted again once the index grew by a quarter."""
        cached = self._term_counts.get(term)
        if cached is not None and total <= cached[1] * 1.25:
            return cached[0]
        count = self._db.execute(
            "SELECT COUNT(*) FROM kw_fts WHERE kw_fts MATCH ?", (match_expression([term]),)
        ).fetchone()[0]
        if len(self._term_counts) > 50_000:
            self._term_counts.clear()
        self._term_counts[term] = (int(count), total)
        return int(count)

    def _next_within(self, row: tuple, session: str, within: Spans) -> tuple:  # type: ignore[type-arg]
        """The row with the passage that follows it within the spans (the next one of the same
        branch), where the next position belongs to another branch."""
        item, position, text, score, _, context = row
        if within.following(position) == position + 1:
            return row
        following = within.following(position)
        found = (
            None
            if following is None
            else self._db.execute(
                "SELECT text FROM kw_passages WHERE session = ? AND position = ?",
                (session, following),
            ).fetchone()
        )
        return (item, position, text, score, found[0] if found else "", context)

    def _chained(self, row: tuple, session: str, within: Spans | None) -> tuple:  # type: ignore[type-arg]
        """The row with the passages after its next one that go on speaking of the same thing
        ("A took 3 from it. B took 13 from it."), of the same item, at most ``CHAIN_MORE``: the
        next passage alone showed the first of such a run of changes and hid the others."""
        item, position, text, score, next_text, context = row
        if not next_text or not refers_back(next_text):
            return row
        step = position + 1 if within is None else within.following(position)
        if step is None:
            return row
        parts = [next_text]
        for _ in range(CHAIN_MORE):
            step = step + 1 if within is None else within.following(step)
            if step is None:
                break
            found = self._db.execute(
                "SELECT text, item FROM kw_passages WHERE session = ? AND position = ?",
                (session, step),
            ).fetchone()
            if found is None or found[1] != item or not refers_back(found[0]):
                break
            parts.append(found[0])
        return (item, position, text, score, " ".join(parts), context)

    def _run(
        self,
        terms: Sequence[str],
        params: dict[str, object],
        exclude: list[int],
        within: str = "",
        *,
        scored: bool = True,
    ) -> list[tuple]:  # type: ignore[type-arg]
        """Ranks the newest ``_CANDIDATES`` matches; when filters leave too few, ranks them all.
        Not ``scored``: the newest matches, each scored 0 (no ``bm25()``, which reads every
        word's whole list)."""
        exclusion = ""
        if exclude:
            exclusion = f"AND p.position NOT IN ({','.join(str(int(p)) for p in exclude)})"
        score = "bm25(kw_fts)" if scored else "0.0"
        sql = _SEARCH.format(exclude=exclusion, within=within, score=score)
        bound = {**params, "match": match_expression(terms), "candidates": _CANDIDATES}
        rows = self._db.execute(sql, bound).fetchall()
        if len(rows) < int(str(params["k"])):
            capped = self._db.execute(
                "SELECT COUNT(*) FROM (SELECT 1 FROM kw_fts WHERE kw_fts MATCH :match "
                "AND rowid BETWEEN :low_id AND :high_id LIMIT :candidates)",
                bound,
            ).fetchone()[0]
            if capped >= _CANDIDATES:
                rows = self._db.execute(sql, {**bound, "candidates": -1}).fetchall()
        return rows

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidStateError(f"{self!r} is closed; make a new one to search again.")
