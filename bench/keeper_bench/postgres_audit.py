"""What the shared database holds after a scale-out run, and what it costs in bytes.

Kept apart from the traffic and the replicas (``scale_out.py``) because it reads the database
only, after every process has stopped: each session's archive is checked against what its agent
sent (no turn lost, repeated or another session's), and the database's size per million archived
tokens is measured on archives written as the keeper writes them.
"""

from __future__ import annotations

import json
import os
import random
from functools import partial
from typing import Any


def audit(database: str, tags: list[str], turns: int) -> dict[str, Any]:
    """Every session's archive against what its agent sent; raises AssertionError on a breach."""
    from langchain_core.messages import message_to_dict

    from keeper_middleware.archive.postgres import PostgresArchive
    from keeper_middleware.integrations.proxy.sessions.records import RECORD_KEY, StoredRecord
    from keeper_middleware.integrations.proxy.sessions.tenants import DEFAULT_TENANT

    problems: list[str] = []
    cuts = versions_total = archived_tokens = 0
    with PostgresArchive(database) as archive:
        for tag in tags:
            stored = f"{DEFAULT_TENANT}:{tag}"
            turns_kept = list(archive.turns(stored))
            contents = [t.content for t in turns_kept if t.role == "human"]
            if len(contents) != len(set(contents)):
                problems.append(f"{tag}: a turn archived twice")
            if any(f"[[{tag}]]" not in c for c in contents):
                problems.append(f"{tag}: another session's text in its archive")
            items = sorted(int(c.split()[1]) for c in contents if c.startswith("Item "))
            if items != list(range(1, len(items) + 1)):
                problems.append(f"{tag}: archived items {items} skip or repeat one")
            head = archive.get_value(stored, RECORD_KEY)
            record = StoredRecord.load(head, partial(archive.get_value, stored)).record
            window = " ".join(json.dumps(message_to_dict(m)) for m in record.window)
            for item in range(len(items) + 1, turns + 1):
                if f"Item {item} for [[{tag}]]" not in window:
                    problems.append(f"{tag}: item {item} is neither archived nor in view")
            versions = sum(1 for _ in archive.notes_versions(stored))
            counted = (archive.get_value(stored, "counters") or {}).get("cuts", 0)
            if versions != counted:
                problems.append(f"{tag}: {versions} NOTES versions but {counted} cuts")
            cuts += counted
            versions_total += versions
            archived_tokens += sum(len(t.content) for t in turns_kept) // 4
        size = archive.size_bytes()
    if problems:
        raise AssertionError("; ".join(problems[:10]))
    return {
        "cuts": cuts,
        "versions": versions_total,
        "archived_tokens": archived_tokens,
        "db_bytes": size,
    }


def size_per_million(database: str, tokens: int = 1_000_000, sessions: int = 8) -> dict[str, Any]:
    """Bytes the database takes for ``tokens`` archived tokens (chars/4), archive and keyword
    index together, written as the keeper writes them (cuts of turns, then their passages)."""
    import psycopg
    from psycopg import sql

    from keeper_bench.retrievers_bench import counter_names, story_sentences
    from keeper_middleware.archive.postgres import PostgresArchive
    from keeper_middleware.archive.records import ArchivedTurn, NotesDraft
    from keeper_middleware.retrievers.postgres_keyword import PostgresKeywordRetriever
    from keeper_middleware.search.indexing import catch_up

    schema = f"size_{os.getpid()}"
    rng = random.Random(7)
    names = counter_names(400, rng)
    sentences = story_sentences(10**9, names, rng)
    written = 0
    try:
        with PostgresArchive(database, schema=schema) as archive:
            index = PostgresKeywordRetriever(archive.url, schema=schema)
            cut = 0
            while written < tokens * 4:
                session = f"size-{cut % sessions}"
                turns = []
                for n in range(10):
                    text = " ".join(next(sentences) for _ in range(12))
                    written += len(text)
                    turns.append(
                        ArchivedTurn(
                            session=session,
                            msg_id=f"{cut}-{n}",
                            item=cut,
                            role="human" if n % 2 == 0 else "ai",
                            content=text,
                        )
                    )
                notes = NotesDraft(first_item=0, last_item=cut, text=f"[NOTES] STATE after {cut}")
                archive.commit_cut(session, cut_key=f"cut-{cut}", turns=turns, notes=notes)
                catch_up(archive, session, (index,))
                cut += 1
            index.close()
            with psycopg.connect(archive.url, autocommit=True) as conn:
                conn.execute(sql.SQL("VACUUM ANALYZE {}.turns").format(sql.Identifier(schema)))
            size = archive.size_bytes()
    finally:
        with psycopg.connect(database, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    return {"tokens": written // 4, "bytes": size}
