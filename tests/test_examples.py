"""The examples run offline, as scripts, and show the keeper working in each kind of agent."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SCRIPTS = ["middleware_agent.py", "react_agent_hook.py", "custom_graph.py"]
EXPECTED_ANSWERS = ["-> 1. 7", "-> 1. 77", "-> 1. 147", "-> 1. 217"]


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.delenv("KEEPER_BASE_URL", raising=False)
    monkeypatch.syspath_prepend(str(EXAMPLES))


@pytest.mark.filterwarnings(
    "ignore:create_react_agent has been moved:langgraph.warnings.LangGraphDeprecatedSinceV10"
)
@pytest.mark.parametrize("script", SCRIPTS)
def test_each_example_answers_from_the_archive_after_several_cuts(script, offline, capsys):
    runpy.run_path(str(EXAMPLES / script), run_name="__main__")
    printed = capsys.readouterr().out
    for answer in EXPECTED_ANSWERS:
        assert answer in printed
    assert "cuts: 5, archived turns: 163" in printed


def test_an_example_runs_as_a_plain_script():
    env = {k: v for k, v in os.environ.items() if k != "KEEPER_BASE_URL"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "custom_graph.py")],
        capture_output=True,
        text=True,
        env={**env, "HF_HUB_OFFLINE": "1"},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "cuts: 5" in done.stdout


@pytest.mark.postgres
def test_the_postgres_example_shares_one_database_between_workers(postgres_url):
    import uuid

    import psycopg

    name = f"example_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = postgres_url.rsplit("/", 1)[0] + f"/{name}"
    env = {k: v for k, v in os.environ.items() if k != "KEEPER_BASE_URL"}
    try:
        done = subprocess.run(
            [sys.executable, str(EXAMPLES / "postgres_agent.py")],
            capture_output=True,
            text=True,
            env={**env, "HF_HUB_OFFLINE": "1", "KEEPER_DATABASE_URL": url},
            timeout=300,
            check=False,
        )
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {name} WITH (FORCE)")
    assert done.returncode == 0, done.stderr
    assert "worker 2: 1. What was r1 recorded at? -> 1. 7" in done.stdout
    assert "notes versions: 4" in done.stdout
