"""Archive faults: a full disk, a damaged file, a file deleted or replaced under a running
keeper. Each is an ``ArchiveError`` that names the file and says what to do; nothing is
acknowledged and then lost; the index never serves text the archive lacks.

A full disk and a damaged file used to raise bare ``sqlite3.OperationalError`` /
``DatabaseError`` (the file was not checked when opened); a deleted archive was written on
regardless, and after a restart the acknowledged turns were gone with no error while the
surviving index still served their text.

The full-disk tests run on a real small file system: a tmpfs mounted for the test (the
``small_disk`` fixture; root and a working ``mount`` are needed, elsewhere they are skipped and
say why).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from langchain_core.messages import BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver

from keeper_middleware import ArchiveError, Keeper, KeeperConfig, SQLiteArchive, create_keeper_agent
from keeper_middleware.messages.facts import keeper_kind, text_of
from tests.fake_model import ScriptedChatModel
from tests.small_disk import fill

THREAD = {"configurable": {"thread_id": "t1"}}
CONFIG = KeeperConfig(window=4096, reply_reserve=512, notes_every_items=3)


def notes_or_ok(messages: list[BaseMessage]) -> str:
    if keeper_kind(messages[-1]) in ("notes_request", "notes_reask"):
        return "NO CHANGES"
    return "ok"


def item(n: int) -> str:
    return f"Item {n}. The clerk recorded zephyr{n} at {n * 7} in the blue ledger."


def run_items(agent, numbers) -> None:
    for n in numbers:
        agent.invoke({"messages": [HumanMessage(item(n))]}, THREAD)


def agent_on(archive: Path, checkpointer=None):
    keeper = Keeper(CONFIG, archive=archive)
    agent = create_keeper_agent(
        ScriptedChatModel(default=notes_or_ok),
        keeper=keeper,
        checkpointer=checkpointer or InMemorySaver(),
    )
    return agent, keeper


# ------------------------------------------------------------------ a full disk


def test_a_full_disk_is_an_archive_error_and_the_step_runs_again_once_there_is_room(small_disk):
    archive = small_disk / "agent.sqlite3"
    agent, keeper = agent_on(archive)
    agent.invoke({"messages": [HumanMessage("Task: keep the ledger.")]}, THREAD)
    run_items(agent, range(1, 5))
    archived = keeper.archive.turn_count("t1")
    state = agent.get_state(THREAD).values
    filler = fill(small_disk)
    with pytest.raises(ArchiveError) as raised:
        run_items(agent, range(5, 12))
    text = str(raised.value)
    assert "full" in text and str(small_disk) in text and "free space" in text
    assert agent.get_state(THREAD).values["messages"][: len(state["messages"])] == state["messages"]
    filler.unlink()
    run_items(agent, range(12, 20))  # room again: the thread goes on
    turns = list(keeper.archive.turns("t1"))
    assert len({t.msg_id for t in turns}) == len(turns), "a turn was archived twice"
    assert keeper.archive.turn_count("t1") > archived
    view = {text_of(m) for m in agent.get_state(THREAD).values["messages"]}
    contents = {t.content for t in turns}
    for n in (*range(1, 5), *range(12, 20)):
        assert item(n) in contents or item(n) in view, f"item {n} was lost"


def test_a_full_disk_under_the_keyword_index_is_an_archive_error_naming_the_index(small_disk):
    from keeper_middleware.retrievers.base import Passage
    from keeper_middleware.retrievers.keyword import KeywordRetriever

    index = KeywordRetriever(small_disk / "keyword.sqlite3")
    fill(small_disk)
    passages = [Passage("s", 1, n, f"sentence {n} " + "word " * 200) for n in range(2000)]
    with pytest.raises(ArchiveError, match=r"keyword index .*full.*free space"):
        index.add(passages)
    index.close()


# ------------------------------------------------------------------ a damaged file


def damaged_archive(tmp_path: Path) -> Path:
    path = tmp_path / "agent.sqlite3"
    with SQLiteArchive(path) as store:
        from keeper_middleware.archive.records import ArchivedTurn

        turns = [
            ArchivedTurn(session="s", msg_id=f"m{n}", item=n, role="human", content="x" * 900)
            for n in range(400)
        ]
        store.commit_cut("s", cut_key="c1", turns=turns, notes=None)
    with sqlite3.connect(path) as raw:
        raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(path.read_bytes())
    page = 4096
    for start in range(3 * page, len(data) - page, 7 * page):  # garbage over some pages
        data[start + 100 : start + page] = os.urandom(page - 100)
    path.write_bytes(bytes(data))
    return path


def test_a_damaged_archive_is_refused_when_opened(tmp_path):
    path = damaged_archive(tmp_path)
    with pytest.raises(ArchiveError, match=rf"{path}.*damaged.*quick_check.*backup"):
        SQLiteArchive(path)
    with pytest.raises(ArchiveError, match="damaged"):
        Keeper(archive=path)


def test_damage_found_later_is_an_archive_error_not_a_bare_sqlite_error(tmp_path):
    path = damaged_archive(tmp_path)
    store = SQLiteArchive(path, check="off")
    with pytest.raises(ArchiveError, match=rf"{path}.*(damaged|not a keeper archive)"):
        list(store.turns("s"))
    store.close()


# ------------------------------------------------------------------ deleted or replaced


def test_an_archive_deleted_under_a_running_keeper_is_found_before_the_next_write(tmp_path):
    archive = tmp_path / "agent.sqlite3"
    agent, keeper = agent_on(archive)
    agent.invoke({"messages": [HumanMessage("Task: keep the ledger.")]}, THREAD)
    run_items(agent, range(1, 8))
    acknowledged = {t.msg_id for t in keeper.archive.turns("t1")}
    assert acknowledged and keeper.counters("t1").cuts >= 1
    archive.unlink()
    with pytest.raises(ArchiveError, match=rf"{archive}.*was deleted.*rescue"):
        run_items(agent, [8])
    assert not archive.exists()  # nothing was written to a file no one can open again
    keeper.archive.rescue(archive)  # what this process held is saved back
    keeper.close()
    again = Keeper(CONFIG, archive=archive)
    assert acknowledged <= {t.msg_id for t in again.archive.turns("t1")}
    again.close()


def test_an_archive_replaced_under_a_running_keeper_is_refused(tmp_path):
    archive = tmp_path / "agent.sqlite3"
    agent, keeper = agent_on(archive)
    agent.invoke({"messages": [HumanMessage("Task: keep the ledger.")]}, THREAD)
    run_items(agent, range(1, 5))
    other = tmp_path / "other.sqlite3"
    SQLiteArchive(other).close()
    os.replace(other, archive)
    with pytest.raises(ArchiveError, match=rf"{archive}.*replaced by another file"):
        run_items(agent, [5])
    with pytest.raises(ArchiveError, match="replaced"):
        keeper.search("t1", "zephyr1")


def test_after_a_restart_on_a_lost_archive_the_thread_says_so_and_search_serves_nothing_stale(
    tmp_path,
):
    archive = tmp_path / "agent.sqlite3"
    with sqlite3.connect(tmp_path / "checkpoints.sqlite3", check_same_thread=False) as conn:
        agent, keeper = agent_on(archive, SqliteSaver(conn))
        agent.invoke({"messages": [HumanMessage("Task: keep the ledger.")]}, THREAD)
        run_items(agent, range(1, 8))
        assert keeper.counters("t1").cuts >= 1
        assert "recorded zephyr1 at 7" in keeper.search("t1", "zephyr1")
        keeper.close()
        for leftover in tmp_path.glob("agent.sqlite3*"):
            leftover.unlink()  # the archive is lost while the process is down; its index is not
        agent, keeper = agent_on(archive, SqliteSaver(conn))
        assert keeper.retriever.count("t1") > 0  # the surviving index still holds the text
        with pytest.raises(ArchiveError, match=r"holds no NOTES.*replaced or deleted"):
            run_items(agent, [8])
        found = keeper.search("t1", "zephyr1")
        assert "recorded zephyr1" not in found and keeper.retriever.count("t1") == 0
        keeper.close()


def test_the_index_is_rebuilt_from_an_older_copy_of_the_archive(tmp_path):
    archive = tmp_path / "agent.sqlite3"
    agent, keeper = agent_on(archive)
    agent.invoke({"messages": [HumanMessage("Task: keep the ledger.")]}, THREAD)
    run_items(agent, range(1, 5))
    keeper.archive.rescue(tmp_path / "backup.sqlite3")  # a backup, taken now
    run_items(agent, range(5, 15))
    assert "recorded zephyr12 at 84" in keeper.search("t1", "zephyr12")
    keeper.close()
    os.replace(tmp_path / "backup.sqlite3", archive)  # the operator restores the older copy
    restored = Keeper(CONFIG, archive=archive)
    assert "recorded zephyr12" not in restored.search("t1", "zephyr12")  # not in this archive
    assert "recorded zephyr1 at 7" in restored.search("t1", "zephyr1")  # what it has is found
    restored.close()


# ------------------------------------------------------------------ PostgreSQL


@pytest.fixture
def postgres_small_database(postgres_url: str) -> Iterator[tuple[str, Path]]:
    """A database of the test server whose files live on a 16 MB tmpfs (a tablespace): its
    URL, and the folder the tmpfs is mounted at."""
    import pwd
    import tempfile

    import psycopg

    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a small tablespace needs root and mount(8) to make (tmpfs)")
    try:
        owner = pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("the test server does not run as the postgres user here")
    where = Path(tempfile.mkdtemp(prefix="keeper-pgspace-", dir="/tmp"))
    os.chmod(where, 0o755)
    options = f"size=16m,mode=0700,uid={owner.pw_uid},gid={owner.pw_gid}"
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if made.returncode != 0:
        where.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    name = f"small_{uuid.uuid4().hex[:8]}"
    try:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"CREATE TABLESPACE {name} LOCATION '{where}'")
            conn.execute(f"CREATE DATABASE {name} TABLESPACE {name}")
        yield postgres_url.rsplit("/", 1)[0] + f"/{name}", where
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            conn.execute(f"DROP TABLESPACE IF EXISTS {name}")
        subprocess.run(["umount", "-l", str(where)], check=False)
        where.rmdir()


@pytest.mark.postgres
def test_a_full_postgres_tablespace_is_an_archive_error(postgres_small_database):
    url, space = postgres_small_database
    keeper = Keeper(CONFIG, archive=url)
    agent = create_keeper_agent(
        ScriptedChatModel(default=notes_or_ok), keeper=keeper, checkpointer=InMemorySaver()
    )
    agent.invoke({"messages": [HumanMessage("Task: keep the ledger.")]}, THREAD)
    run_items(agent, range(1, 5))
    filler = fill(space)
    try:
        with pytest.raises(ArchiveError, match=r"no disk space left.*free space"):
            run_items(agent, range(5, 40))
    finally:
        filler.unlink()
    run_items(agent, range(40, 44))  # room again: the thread goes on
    turns = list(keeper.archive.turns("t1"))
    assert len({t.msg_id for t in turns}) == len(turns), "a turn was archived twice"
    keeper.close()
