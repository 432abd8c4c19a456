"""``keeper-archive migrate``: a SQLite archive moves into PostgreSQL whole, and work continues."""

from __future__ import annotations

import subprocess
import sys

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from keeper_middleware import Keeper, KeeperConfig, SQLiteArchive, create_keeper_agent
from keeper_middleware.archive.cli import main
from keeper_middleware.archive.postgres import PostgresArchive
from keeper_middleware.archive.records import MovedUpdate
from tests.fake_model import ScriptedChatModel
from tests.story_model import StoryModel, batch

pytestmark = pytest.mark.postgres
HANDLE = "resp_" + "a" * 32
CONFIG = KeeperConfig(window=2048, reply_reserve=256, notes_every_items=4)


def run_items(keeper: Keeper, saver, thread: str, items: range) -> None:
    agent = create_keeper_agent(
        ScriptedChatModel(default=StoryModel()), keeper=keeper, checkpointer=saver
    )
    config = {"configurable": {"thread_id": thread}}
    if items.start == 1:
        agent.invoke({"messages": [HumanMessage("Task: read. Rule: keep it exact.")]}, config)
    for i in items:
        agent.invoke(
            {"messages": [HumanMessage(batch(i, f"Today we set c{i} to {i * 3}."))]}, config
        )


def snapshot(archive, session: str):
    turns = [
        (t.seq, t.msg_id, t.item, t.role, t.content, t.reasoning) for t in archive.turns(session)
    ]
    notes = [
        (v.version, v.text, v.data_json, v.cut_key, v.created)
        for v in archive.notes_versions(session)
    ]
    moved = list(archive.moved_rows(session))
    return turns, notes, archive.get_value(session, "counters"), moved


@pytest.fixture
def proxy_folder(tmp_path):
    """A folder laid out like keeper-proxy's --archive-dir, with two sessions after several cuts."""
    folder = tmp_path / "keeper-proxy-data"
    keeper = Keeper(CONFIG, archive=folder / "keeper.sqlite3")
    saver = InMemorySaver()
    run_items(keeper, saver, "alpha", range(1, 19))
    run_items(keeper, saver, "beta", range(1, 9))
    keeper.archive.put_value("alpha", "zürich ✓", {"text": "a\x00b"})
    keeper.archive.put_handle("alpha", HANDLE, {"reply": "r-1", "note": "a\x00b"})
    # entries moved out of the NOTES, one forgotten (moved, nothing to recall)
    keeper.archive.update_moved(
        "alpha", MovedUpdate(add=(("c90", "3"), ("Łódź kasa", "a\x00b"), ("gone", None)))
    )
    keeper.close()
    return folder, saver


def test_migrate_copies_every_session_exactly_and_can_run_again(
    proxy_folder, postgres_url, pg_schema
):
    folder, _ = proxy_folder
    args = ["migrate", str(folder), postgres_url, "--schema", pg_schema]
    done = subprocess.run(
        [sys.executable, "-m", "keeper_middleware.archive.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "done: 2 sessions" in done.stdout
    with (
        SQLiteArchive(folder / "keeper.sqlite3") as source,
        PostgresArchive(postgres_url, schema=pg_schema) as target,
    ):
        assert target.sessions() == source.sessions() == ["alpha", "beta"]
        for session in ("alpha", "beta"):
            assert snapshot(target, session) == snapshot(source, session)
            assert len(snapshot(target, session)[1]) >= 2, "several cuts were migrated"
        assert target.moved_named("alpha", {"łódź"}) == [("Łódź kasa", "a\x00b")]
        assert target.get_value("alpha", "zürich ✓") == {"text": "a\x00b"}
        assert target.find_handle(HANDLE) == source.find_handle(HANDLE) is not None
    assert main(args) == 0  # again: nothing is copied twice
    with (
        PostgresArchive(postgres_url, schema=pg_schema) as target,
        SQLiteArchive(folder / "keeper.sqlite3") as source,
    ):
        assert snapshot(target, "alpha") == snapshot(source, "alpha")


def test_work_continues_on_postgres_with_search_over_what_was_migrated(
    proxy_folder, postgres_url, pg_schema
):
    folder, saver = proxy_folder
    with SQLiteArchive(folder / "keeper.sqlite3") as source:
        versions_before = sum(1 for _ in source.notes_versions("alpha"))
    assert (
        main(["migrate", str(folder), postgres_url, "--schema", pg_schema, "--session", "alpha"])
        == 0
    )
    keeper = Keeper(CONFIG, archive=PostgresArchive(postgres_url, schema=pg_schema))
    try:
        assert "item 1:" in keeper.search("alpha", "c1"), "the keyword index was rebuilt"
        run_items(keeper, saver, "alpha", range(19, 27))
        versions = [v.version for v in keeper.archive.notes_versions("alpha")]
        assert versions == list(range(1, len(versions) + 1))
        assert len(versions) > versions_before
        notes = keeper.notes("alpha")
        assert notes.state_dict() == {f"c{i}": str(i * 3) for i in range(1, notes.last_item + 1)}
        assert keeper.archive.sessions() == ["alpha"]
    finally:
        keeper.close()


def test_a_source_that_is_not_an_archive_is_refused(tmp_path, postgres_url, pg_schema, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["migrate", str(tmp_path / "empty"), postgres_url, "--schema", pg_schema]) == 2
    assert "without keeper.sqlite3" in capsys.readouterr().err
    bogus = tmp_path / "bogus.sqlite3"
    bogus.write_bytes(b"not a database" * 100)
    assert main(["migrate", str(bogus), postgres_url, "--schema", pg_schema]) == 2
    assert "not a keeper archive" in capsys.readouterr().err


def test_info_lists_sessions_of_either_backend(proxy_folder, postgres_url, pg_schema, capsys):
    folder, _ = proxy_folder
    assert main(["info", str(folder)]) == 0
    sqlite_listing = capsys.readouterr().out
    main(["migrate", str(folder), postgres_url, "--schema", pg_schema])
    capsys.readouterr()
    assert main(["info", postgres_url, "--schema", pg_schema]) == 0
    assert capsys.readouterr().out == sqlite_listing
    assert "alpha" in sqlite_listing


def test_migrate_copies_a_forked_session_branch_by_branch(tmp_path, postgres_url, pg_schema):
    from keeper_middleware.archive.postgres.migrate import migrate
    from keeper_middleware.archive.records import ArchivedTurn

    def turn(msg_id: str, content: str) -> ArchivedTurn:
        return ArchivedTurn(session="s", msg_id=msg_id, item=1, role="human", content=content)

    path = tmp_path / "forked.sqlite3"
    with SQLiteArchive(path) as source:
        source.commit_cut("s", cut_key="root", turns=[turn("task", "the task")], notes=None)
        source.commit_cut(
            "s",
            cut_key="left",
            turns=[turn("m1", "edited"), turn("r1", "reply")],
            notes=None,
            moved=MovedUpdate(add=(("a", "1"), ("b", "2"))),
        )
        source.commit_cut(
            "s",
            cut_key="right",
            turns=[turn("m1", "original"), turn("r1", "reply")],
            notes=None,
            moved=MovedUpdate(add=(("c", "3"),)),
            parent="root",
        )
        source.commit_cut(
            "s",
            cut_key="left-2",
            turns=[],
            notes=None,
            moved=MovedUpdate(forget=("a",), drop=("b",)),
            parent="left",
        )
        before = {
            head: (
                [(t.seq, t.content) for t in source.turns("s", within=source.chain("s", head))],
                list(source.moved_rows("s", within=source.chain("s", head))),
            )
            for head in ("left-2", "right")
        }
    migrate(path, postgres_url, schema=pg_schema)
    with PostgresArchive(postgres_url, schema=pg_schema) as target:
        after = {
            head: (
                [(t.seq, t.content) for t in target.turns("s", within=target.chain("s", head))],
                list(target.moved_rows("s", within=target.chain("s", head))),
            )
            for head in ("left-2", "right")
        }
        assert target.turn_count("s") == 4  # the shared reply is linked, not copied
    assert after == before
    assert before["right"] == ([(0, "the task"), (3, "original"), (2, "reply")], [("c", "3")])
    assert before["left-2"][1] == [("a", None)]
