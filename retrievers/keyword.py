"""The default backend: BM25 over SQLite FTS5, with no dependency beyond the standard library.

Passages live in a plain table (``kw_passages``) and an external-content FTS5 index
(``kw_fts``) kept in step by triggers, so adding is incremental and the tables can share the
archive's SQLite file. The tokenizer is ``porter unicode61 remove_diacritics 2``: names with
digits (``domo86``) stay one token and are found by exact query, while "recorded" also finds
"record". FTS5's ``bm25()`` uses k1=1.2, b=0.75 and its own IDF, ``log((N - n + 0.5) / (n +
0.5))`` floored at a tiny positive number, so a term in more than half the passages adds almost
nothing (rank-bm25's Okapi floors such terms at a fraction of the mean IDF instead); the top
results agree with rank-bm25 on a corpus whose ordering is unambiguous (tested).

Speed: FTS5 scores every row that matches any query term. A term found in more than
``_COMMON_TERM_FRACTION`` of a session-wide index adds almost nothing to BM25, so when a query
also has rarer terms, the common ones are dropped first and only brought back when the rarer
terms give fewer than ``k`` hits. That keeps "the clerk recorded domo86" as fast as "domo86".
"""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Sequence
from os import PathLike
from pathlib import Path

from keeper_middleware.retrievers.base import Hit, Passage, check_search_arguments

_TOKEN = re.compile(r"\w+", re.UNICODE)
_COMMON_TERM_FRACTION = 0.05
_TOKENIZER = "porter unicode61 remove_diacritics 2"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kw_passages (
    id INTEGER PRIMARY KEY,
    session TEXT NOT NULL,
    item INTEGER NOT NULL,
    position INTEGER NOT NULL,
    text TEXT NOT NULL,
    UNIQUE (session, position)
);
CREATE VIRTUAL TABLE IF NOT EXISTS kw_fts USING fts5(
    text, content='kw_passages', content_rowid='id',
    tokenize='{tokenizer}'
);
CREATE VIRTUAL TABLE IF NOT EXISTS kw_vocab USING fts5vocab(kw_fts, 'row');
CREATE TRIGGER IF NOT EXISTS kw_passages_ai AFTER INSERT ON kw_passages BEGIN
    INSERT INTO kw_fts (rowid, text) VALUES (new.id, new.text);
END;
CREATE TRIGGER IF NOT EXISTS kw_passages_ad AFTER DELETE ON kw_passages BEGIN
    INSERT INTO kw_fts (kw_fts, rowid, text) VALUES ('delete', old.id, old.text);
END;
CREATE TRIGGER IF NOT EXISTS kw_passages_au AFTER UPDATE ON kw_passages BEGIN
    INSERT INTO kw_fts (kw_fts, rowid, text) VALUES ('delete', old.id, old.text);
    INSERT INTO kw_fts (rowid, text) VALUES (new.id, new.text);
END;
"""

_UPSERT = """
INSERT INTO kw_passages (session, item, position, text) VALUES (?, ?, ?, ?)
ON CONFLICT (session, position) DO UPDATE SET item = excluded.item, text = excluded.text
WHERE kw_passages.item != excluded.item OR kw_passages.text != excluded.text
"""

_SEARCH = """
SELECT p.item, p.position, p.text, -bm25(kw_fts) AS score, COALESCE(n.text, '')
FROM kw_fts
JOIN kw_passages AS p ON p.id = kw_fts.rowid
LEFT JOIN kw_passages AS n ON n.session = p.session AND n.position = p.position + 1
WHERE kw_fts MATCH :match AND p.session = :session
  AND p.item >= :from_item AND p.item <= :to_item {exclude}
ORDER BY score DESC, p.position DESC
LIMIT :k
"""

_MIN_ITEM = -(2**63)
_MAX_ITEM = 2**63 - 1


def query_terms(query: str) -> list[str]:
    """The distinct lowercase word tokens of free text, in order of first appearance."""
    seen: dict[str, None] = {}
    for token in _TOKEN.findall(query.lower()):
        seen.setdefault(token, None)
    return list(seen)


def match_expression(terms: Sequence[str]) -> str:
    """An FTS5 MATCH string that ORs every term, each quoted so no word acts as an operator."""
    return " OR ".join('"' + term.replace('"', '""') + '"' for term in terms)


class KeywordRetriever:
    """BM25 keyword search over SQLite FTS5; incremental, persistent, safe across threads."""

    def __init__(self, path: str | PathLike[str] = ":memory:") -> None:
        location = str(path)
        if location != ":memory:":
            Path(location).parent.mkdir(parents=True, exist_ok=True)
        self._path = location
        self._lock = threading.Lock()
        self._db = sqlite3.connect(location, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA.format(tokenizer=_TOKENIZER))
        self._stemmer = sqlite3.connect(":memory:", check_same_thread=False)
        self._stemmer.executescript(
            f"CREATE VIRTUAL TABLE t USING fts5(text, tokenize='{_TOKENIZER}');"
            "CREATE VIRTUAL TABLE v USING fts5vocab(t, 'row');"
        )
        self._closed = False

    def add(self, passages: Sequence[Passage]) -> None:
        rows = [(p.session, p.item, p.position, p.text) for p in passages]
        if not rows:
            return
        with self._lock:
            self._check_open()
            self._db.execute("BEGIN")
            try:
                self._db.executemany(_UPSERT, rows)
            except BaseException:
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
    ) -> list[Hit]:
        check_search_arguments(k, from_item, to_item)
        terms = query_terms(query)
        if not terms:
            return []
        params: dict[str, object] = {
            "session": session,
            "from_item": _MIN_ITEM if from_item is None else from_item,
            "to_item": _MAX_ITEM if to_item is None else to_item,
            "k": k,
        }
        with self._lock:
            self._check_open()
            rare = self._rare_terms(terms)
            rows = self._run(rare, params, exclude=[])
            if len(rows) < k and len(rare) < len(terms):
                found = [position for _, position, *_ in rows]
                rows += self._run(terms, {**params, "k": k - len(rows)}, exclude=found)
        return [
            Hit(
                passage=Passage(session=session, item=item, position=position, text=text),
                score=float(score),
                next_text=next_text,
            )
            for item, position, text, score, next_text in rows
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
                self._stemmer.close()

    def __repr__(self) -> str:
        return f"KeywordRetriever({self._path!r})"

    def _rare_terms(self, terms: list[str]) -> list[str]:
        """Drops the terms most passages contain, unless nothing rarer is left."""
        if len(terms) < 2:
            return terms
        total = self._db.execute("SELECT COALESCE(MAX(id), 0) FROM kw_passages").fetchone()[0]
        counts = {
            term: self._db.execute(
                "SELECT COALESCE(SUM(doc), 0) FROM kw_vocab WHERE term = ?",
                (self._index_form(term),),
            ).fetchone()[0]
            for term in terms
        }
        rare = [term for term in terms if counts[term] <= total * _COMMON_TERM_FRACTION]
        return rare or terms

    def _index_form(self, term: str) -> str:
        """The term as the index stores it (stemmed), so its document count can be looked up."""
        self._stemmer.execute("INSERT INTO t (text) VALUES (?)", (term,))
        row = self._stemmer.execute("SELECT term FROM v LIMIT 1").fetchone()
        self._stemmer.execute("DELETE FROM t")
        return str(row[0]) if row else term

    def _run(self, terms: Sequence[str], params: dict[str, object], exclude: list[int]) -> list[tuple]:  # type: ignore[type-arg]
        exclusion = ""
        if exclude:
            exclusion = f"AND p.position NOT IN ({','.join(str(int(p)) for p in exclude)})"
        sql = _SEARCH.format(exclude=exclusion)
        return self._db.execute(sql, {**params, "match": match_expression(terms)}).fetchall()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed; make a new one to search again.")

