"""The archive on PostgreSQL: one argument to choose it, clear errors, migrations, and many writers
on one session that take turns and never cut twice."""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest
from langchain_core.messages import HumanMessage

from keeper_middleware import ArchiveError, Keeper, KeeperConfig, create_keeper_agent
from keeper_middleware.archive.postgres import MIGRATIONS, PostgresArchive, redact_url
from keeper_middleware.archive.store import ArchiveSchemaError, open_archive
from keeper_middleware.retrievers.postgres_keyword import PostgresKeywordRetriever
from keeper_middleware.sessions.locks import SessionLocks
from tests.fake_model import ScriptedChatModel
from tests.story_model import StoryModel, batch

ROOT = Path(__file__).resolve().parents[1]


def with_user(url: str, user: str, password: str) -> str:
    return url.replace("keeper@", f"{user}:{password}@", 1)


# ---------------------------------------------------------------- no server needed


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://ann:s3cr%40t@db:5432/app", "postgresql://ann:***@db:5432/app"),
        ("postgres://ann@db/app", "postgres://ann@db/app"),
        ("postgresql://db/app?password=s3cret&sslmode=require", "sslmode=require"),
        ("host=db user=ann password='s3 cr' dbname=app", "password=***"),
    ],
)
def test_a_url_is_shown_without_its_password(url, shown):
    assert shown in redact_url(url)
    assert "s3" not in redact_url(url)


def test_a_bad_url_or_schema_says_what_to_pass():
    with pytest.raises(ValueError, match=r"postgresql://user:password@host"):
        PostgresArchive("mysql://ann:pw@db/app")
    with pytest.raises(ValueError, match="tenant_a"):
        PostgresArchive("postgresql://db/app", schema="Robert'); DROP")


def test_a_server_that_is_down_is_named_without_the_password():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"postgresql://ann:hunter2@127.0.0.1:{port}/app"
    with pytest.raises(ArchiveError, match=f"cannot reach .*127.0.0.1:{port}") as caught:
        Keeper(archive=url)
    assert "hunter2" not in str(caught.value)
    assert "ann:***@" in str(caught.value)


def test_in_process_threads_on_one_session_take_turns():
    keeper = Keeper()
    inside: list[int] = []
    overlaps: list[int] = []

    def work(n: int) -> None:
        for _ in range(20):
            with keeper.session("s"):
                inside.append(n)
                if len(inside) > 1:
                    overlaps.append(n)
                time.sleep(0.001)
                inside.remove(n)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert overlaps == []
    with keeper.session("s"), keeper.session("s"):
        pass  # re-entrant along one flow of control


# ---------------------------------------------------------------- against a real server

postgres = pytest.mark.postgres


@postgres
def test_one_argument_puts_archive_and_keyword_index_in_the_database(
    postgres_url, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    keeper = Keeper(
        KeeperConfig(window=2048, reply_reserve=256, notes_every_items=5), archive=postgres_url
    )
    try:
        assert isinstance(keeper.archive, PostgresArchive)
        assert isinstance(keeper.retriever, PostgresKeywordRetriever)
        agent = create_keeper_agent(
            ScriptedChatModel(default=StoryModel()), keeper=keeper, checkpointer=None
        )
        messages = [HumanMessage("Task: read. Rule: keep it exact.")]
        for i in range(1, 13):
            messages.append(HumanMessage(batch(i, f"Today we set c{i} to {i * 3}.")))
            messages = agent.invoke({"messages": messages}, {"configurable": {"thread_id": "one"}})[
                "messages"
            ]
        assert keeper.counters("one").cuts >= 2
        assert "item 1:" in keeper.search("one", "c1")
        assert list(tmp_path.iterdir()) == [], "a PostgreSQL deployment writes no local files"
    finally:
        keeper.archive.delete_session("one")
        keeper.retriever.delete_session("one")
        keeper.close()


@postgres
def test_every_entry_point_takes_the_url(postgres_url, pg_schema):
    from keeper_middleware.integrations.langchain import KeeperMiddleware

    opened = open_archive(postgres_url)
    assert isinstance(opened, PostgresArchive) and opened.schema == "keeper"
    opened.close()
    middleware = KeeperMiddleware(ScriptedChatModel(default=StoryModel()), archive=postgres_url)
    assert isinstance(middleware.keeper.archive, PostgresArchive)
    middleware.keeper.close()


@postgres
def test_a_schema_holding_other_tables_is_refused(postgres_url, pg_schema):
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {pg_schema}")
        conn.execute(f"CREATE TABLE {pg_schema}.turns (x int)")
    with pytest.raises(ArchiveSchemaError, match="not a keeper archive"):
        PostgresArchive(postgres_url, schema=pg_schema)


@postgres
def test_a_database_migrated_by_a_newer_version_is_refused(postgres_url, pg_schema):
    PostgresArchive(postgres_url, schema=pg_schema).close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {pg_schema}.keeper_migrations VALUES (%s)", (len(MIGRATIONS),))
    with pytest.raises(ArchiveSchemaError, match="upgrade keeper-middleware"):
        PostgresArchive(postgres_url, schema=pg_schema)


@postgres
def test_replicas_starting_at_once_migrate_once(postgres_url, pg_schema):
    opened: list[PostgresArchive] = []
    errors: list[BaseException] = []

    def start() -> None:
        try:
            opened.append(PostgresArchive(postgres_url, schema=pg_schema, max_size=2))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert {archive.migration for archive in opened} == {len(MIGRATIONS) - 1}
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        rows = conn.execute(f"SELECT v FROM {pg_schema}.keeper_migrations ORDER BY v").fetchall()
    assert [r[0] for r in rows] == list(range(len(MIGRATIONS)))
    for archive in opened:
        archive.close()


@postgres
def test_a_role_without_rights_gets_an_error_that_says_what_to_grant(postgres_url, pg_schema):
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS limited_keeper")
        conn.execute("CREATE ROLE limited_keeper LOGIN")
    try:
        url = with_user(postgres_url, "limited_keeper", "pa55word")
        with pytest.raises(ArchiveError, match="grant it CREATE") as caught:
            PostgresArchive(url, schema=pg_schema)
        assert "pa55word" not in str(caught.value)
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute("DROP ROLE limited_keeper")


def worker(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.session_worker", *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@postgres
def test_two_processes_holding_one_session_never_overlap(postgres_url, pg_schema):
    PostgresArchive(postgres_url, schema=pg_schema).close()
    children = [worker("hold", postgres_url, pg_schema, "shared", "25") for _ in range(2)]
    spans = []
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        spans += [tuple(map(float, line.split())) for line in out.splitlines()]
    spans.sort()
    assert len(spans) == 50
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end, "two processes held one session at once"


@postgres
def test_a_killed_holder_releases_its_sessions(postgres_url, pg_schema):
    archive = PostgresArchive(postgres_url, schema=pg_schema)
    child = worker("sleep", postgres_url, pg_schema, "s")
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "held"
        impatient = SessionLocks(archive, timeout=0.3)
        with pytest.raises(ArchiveError, match="stayed busy"), impatient.hold("s"):
            pass
        with impatient.hold("other"):
            pass  # other sessions are not held up
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        patient = SessionLocks(archive, timeout=30)
        with patient.hold("s") as took:
            assert took
    finally:
        child.kill()
        child.wait()
        archive.close()


@postgres
def test_two_workers_stepping_one_session_at_once_cut_it_once(postgres_url, pg_schema):
    PostgresArchive(postgres_url, schema=pg_schema).close()
    children = [worker("step", postgres_url, pg_schema, "s") for _ in range(2)]
    for child in children:  # both loaded and connected, then both step at once
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    outputs = [child.communicate(timeout=120) for child in children]
    for child, (_, err) in zip(children, outputs, strict=True):
        assert child.returncode == 0, err
    windows = [out.splitlines()[0] for out, _ in outputs]
    assert windows[0] == windows[1], "both workers must end with the same window"
    assert windows[0].startswith("cut=True")
    calls = sorted(out.splitlines()[1] for out, _ in outputs)
    assert calls == ["note calls 0", "note calls 1"], "the second worker asked for notes again"
    with PostgresArchive(postgres_url, schema=pg_schema) as archive:
        assert len(list(archive.notes_versions("s"))) == 1
        counters = archive.get_value("s", "counters")
        assert counters["notes_calls"] == 1, "the second worker asked for notes again"
        ids = [t.msg_id for t in archive.turns("s")]
        assert len(ids) == len(set(ids)) > 0


@postgres
def test_a_value_of_none_deletes_its_key(postgres_url, pg_schema):
    with PostgresArchive(postgres_url, schema=pg_schema) as archive:
        archive.put_values("s", {"kept": 1, "retired": [1, 2]})
        archive.put_values("s", {"kept": 2, "retired": None})
        assert archive.get_value("s", "retired") is None
        assert archive.get_value("s", "kept") == 2
        archive.put_values("s", {"retired": None})  # only deletes: still one transaction
        assert archive.get_value("s", "kept") == 2
