"""Archives written before branches keep working: a SQLite file (schema version 2) and a
PostgreSQL schema (migration 10), both written by the previous release with its checkpoints
(``tests/fixtures/make_legacy_archive.py``), open with every turn, NOTES version, moved entry and
search result as that release had them, continue their thread from its checkpoints, and can be
travelled back in: a checkpoint written before the upgrade finds its own NOTES and records."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.sqlite import SqliteSaver

from keeper_middleware import Keeper, KeeperConfig, create_keeper_agent
from keeper_middleware.archive.records import turn_digest
from keeper_middleware.archive.store import SCHEMA_VERSION
from tests.branch_runs import Memory, memory_of
from tests.fake_model import ScriptedChatModel
from tests.story_model import StoryModel

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "legacy_v2"
THREAD = {"configurable": {"thread_id": "legacy"}}
CONFIG = KeeperConfig(window=4096, reply_reserve=256, notes_every_items=3, notes_budget=512)
TASK = "Task: read every item. Rule: report every figure exactly as recorded."
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())


def story(i: int) -> str:
    """The fixture's story items (``make_legacy_archive.story``)."""
    counters = " ".join(
        f"Today we set c{i}{suffix} to {i * 10 + n}." for n, suffix in enumerate("abcd")
    )
    return f"Item {i}. {counters} " + "The day went on quietly. " * 4


def answer(messages):
    return "1. I do not know."


def agent(keeper: Keeper, checkpoints: Path):
    saver = SqliteSaver(sqlite3.connect(checkpoints, check_same_thread=False))
    model = ScriptedChatModel(default=StoryModel(answer=answer))
    return create_keeper_agent(model, keeper=keeper, checkpointer=saver)


def as_released(keeper: Keeper) -> dict:
    session = "legacy"
    return {
        "turns": [
            [t.seq, t.msg_id, t.item, t.role, t.content] for t in keeper.archive.turns(session)
        ],
        "notes_versions": [
            [v.version, v.first_item, v.last_item, v.cut_key, v.text]
            for v in keeper.archive.notes_versions(session)
        ],
        "moved": [list(row) for row in keeper.archive.moved_rows(session)],
        "search_c3a": [
            [h.passage.item, h.passage.text]
            for h in keeper.retriever.search("c3a", session=session)
        ],
        "counters": keeper.archive.get_value(session, "counters"),
    }


def continue_and_travel(keeper: Keeper, checkpoints: Path, expected: dict) -> None:
    """The thread goes on from its last checkpoint (written before the upgrade), then a
    checkpoint from the middle of the old history is travelled back to and forked."""
    graph = agent(keeper, checkpoints)
    released = len(expected["notes_versions"])
    for i in range(25, 31):
        graph.invoke({"messages": [HumanMessage(story(i), id=f"item-{i}")]}, THREAD)
    versions = list(keeper.archive.notes_versions("legacy"))
    assert [v.version for v in versions] == list(range(1, len(versions) + 1))
    assert len(versions) > released  # the thread went on cutting, numbering on
    head = keeper.head_of("legacy", graph.get_state(THREAD).values)
    notes = keeper.notes("legacy", head=head)
    assert notes.last_item > 23 and notes.rules == ("report every figure exactly as recorded.",)
    records = [(t.msg_id, t.digest) for t in keeper.archive.turns("legacy")]
    assert len(records) == len(set(records))  # nothing archived twice
    assert any("c28a" in h.passage.text for h in keeper.retrieve("legacy", "c28a", head=head))
    # back to a checkpoint the previous release wrote, after item 10, and a new item there
    old = next(
        s
        for s in reversed(list(graph.get_state_history(THREAD)))
        if not s.next and s.values["messages"][-2].id == "item-10"
    )
    old_head = keeper.head_of("legacy", old.values)
    old_notes = keeper.notes("legacy", head=old_head)
    assert old_notes.last_item is not None and old_notes.last_item <= 10
    graph.invoke(
        {"messages": [HumanMessage("Item 11. Today we set zz to 5.", id="fork-11")]}, old.config
    )
    fork = keeper.head_of("legacy", graph.get_state(THREAD).values)
    mine = memory_of(keeper, "legacy", fork)
    assert not keeper.retrieve("legacy", "c20a", head=fork)  # archived later, on the old line
    assert keeper.retrieve("legacy", "c3a", head=fork)
    assert mine == fresh_thread_memory()


def fresh_thread_memory() -> Memory:
    """What a new thread fed the forked branch's history remembers (the same inputs)."""
    from langgraph.checkpoint.memory import InMemorySaver

    keeper = Keeper(CONFIG)
    graph = create_keeper_agent(
        ScriptedChatModel(default=StoryModel(answer=answer)),
        keeper=keeper,
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": "legacy"}}
    graph.invoke({"messages": [HumanMessage(TASK, id="task")]}, config)
    for i in range(1, 11):
        text = story(i)
        if i == 9:
            text += " " + " ".join(
                f"Line {n} of the appendix says nothing new." for n in range(900)
            )
        graph.invoke({"messages": [HumanMessage(text, id=f"item-{i}")]}, config)
    graph.invoke(
        {"messages": [HumanMessage("Item 11. Today we set zz to 5.", id="fork-11")]}, config
    )
    return memory_of(keeper, "legacy", keeper.head_of("legacy", graph.get_state(config).values))


def test_a_sqlite_archive_of_the_previous_release_opens_continues_and_forks(tmp_path, caplog):
    folder = tmp_path / "legacy"
    shutil.copytree(FIXTURE, folder)
    keeper = Keeper(CONFIG, archive=folder / "archive.sqlite3")
    with sqlite3.connect(folder / "archive.sqlite3") as raw:
        assert raw.execute("SELECT version FROM schema_version").fetchone() == (SCHEMA_VERSION,)
    assert as_released(keeper) == EXPECTED
    with caplog.at_level("WARNING", logger="keeper_middleware.search.indexing"):
        continue_and_travel(keeper, folder / "checkpoints.sqlite3", EXPECTED)
    # that release indexed sentences; a branch's search found the index cut otherwise than
    # today's whole messages and built it again (the background catch-up waited for it)
    assert "indexing the session again" in caplog.text
    keeper.close()


@pytest.mark.postgres
def test_a_postgres_archive_of_the_previous_release_migrates_continues_and_forks(
    tmp_path, postgres_url, pg_schema
):
    import psycopg

    from keeper_middleware.archive.postgres.schema import BRANCHES_MIGRATION, MIGRATIONS

    rows = json.loads((FIXTURE / "postgres_rows.json").read_text())
    assert [v for (v,) in rows["keeper_migrations"]["rows"]] == list(range(BRANCHES_MIGRATION))
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {pg_schema}")
        for statement in MIGRATIONS[:BRANCHES_MIGRATION]:  # the released list, as it ran
            conn.execute(statement.format(schema=pg_schema))
        keyword = (  # the keyword index's table, as the released retriever made it
            f"CREATE TABLE {pg_schema}.passages (session TEXT NOT NULL, position BIGINT NOT NULL,"
            " item BIGINT NOT NULL, text BYTEA NOT NULL, tsv TSVECTOR NOT NULL,"
            " PRIMARY KEY (session, position))"
        )
        conn.execute(keyword)
        for table in (
            "sessions",
            "cuts",
            "turns",
            "notes",
            "kv",
            "moved",
            "passages",
            "keeper_migrations",
        ):
            columns = rows[table]["columns"]
            types = dict(
                conn.execute(
                    "SELECT column_name, udt_name FROM information_schema.columns "
                    "WHERE table_schema = %s AND table_name = %s",
                    (pg_schema, table),
                ).fetchall()
            )
            marks = ", ".join(f"%s::{types[c]}" for c in columns)
            for row in rows[table]["rows"]:
                values = [bytes.fromhex(v["hex"]) if isinstance(v, dict) else v for v in row]
                conn.execute(
                    f"INSERT INTO {pg_schema}.{table} ({', '.join(columns)}) VALUES ({marks})",
                    values,
                )
    keeper = Keeper(CONFIG, archive=f"{postgres_url}?schema={pg_schema}")
    assert as_released(keeper) == rows["expected"]
    for turn in keeper.archive.turns("legacy"):  # the migration's digests are the records' own
        assert turn.digest == turn_digest(
            item=turn.item,
            role=turn.role,
            content=turn.content,
            tool_calls_json=turn.tool_calls_json,
            tool_call_id=turn.tool_call_id,
            name=turn.name,
            reasoning=turn.reasoning,
        )
    checkpoints = tmp_path / "checkpoints.sqlite3"
    shutil.copy(FIXTURE / "postgres_checkpoints.sqlite3", checkpoints)
    continue_and_travel(keeper, checkpoints, rows["expected"])
    keeper.close()
