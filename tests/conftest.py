import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# ---------------------------------------------------------------- the postgres tier


@pytest.fixture(scope="session")
def postgres_url():
    """A real PostgreSQL server in a temporary folder, started once per test session.

    Where PostgreSQL is not installed the tier is skipped, except in CI (CI=true), where a
    server that cannot start fails the run.
    """
    from keeper_middleware.integrations.postgres_server import (
        LocalPostgres,
        PostgresNotAvailableError,
    )

    server = LocalPostgres()
    try:
        server.start()
    except PostgresNotAvailableError as exc:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"the postgres tier must run in CI: {exc}")
        pytest.skip(f"PostgreSQL is not available here: {exc}")
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def pg_schema(postgres_url):
    """A fresh schema name per test, dropped after it, so tests never see each other's rows."""
    import uuid

    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    yield schema
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
