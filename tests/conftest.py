import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest

# the shared modules whose helpers assert (a proxy conversation, an archive audit) report a failed
# assert with its values, as the test modules do
pytest.register_assert_rewrite("tests.proxy_upstream", "tests.archive_stores", "tests.keeper_stack")


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


PROXY_SUITES = (
    "tests.test_proxy_protocol",
    "tests.test_proxy_sessions",
    "tests.test_proxy_window",
    "tests.test_proxy_searches",
    "tests.test_proxy_bad_input",
    "tests.test_proxy_metrics",
    "tests.test_proxy_pure_parts",
    "tests.test_proxy_tenants",
    "tests.test_proxy_faults",
    "tests.test_proxy_history",
    "tests.test_proxy_socket",
    "tests.test_proxy_fidelity",
    "tests.test_proxy_response_ids",
)


def pytest_generate_tests(metafunc):
    """The proxy suites run twice: on a SQLite folder, and (postgres tier) on PostgreSQL."""
    if metafunc.module.__name__ in PROXY_SUITES and "proxy_archive" in metafunc.fixturenames:
        metafunc.parametrize(
            "proxy_archive",
            ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
            indirect=True,
        )


@pytest.fixture(autouse=True)
def proxy_archive(request, monkeypatch):
    """On PostgreSQL, every ``create_proxy_app(archive_dir=folder)`` of the test gets
    ``archive_url`` instead, one fresh schema per folder (the same folder reopened is the same
    schema, as a restarted replica sees the same database)."""
    backend = getattr(request, "param", "sqlite")
    if backend != "postgres":
        yield backend
        return
    import uuid

    import psycopg

    from keeper_middleware.integrations.proxy import app as app_module

    url = request.getfixturevalue("postgres_url")
    schemas: dict[str, str] = {}
    original = app_module.create_proxy_app

    def on_postgres(*args, archive_dir=None, **options):
        schema = schemas.setdefault(str(archive_dir), f"p_{uuid.uuid4().hex[:12]}")
        return original(*args, archive_url=f"{url}?schema={schema}", **options)

    for module in {request.module, sys.modules.get("tests.proxy_upstream")} - {None}:
        if hasattr(module, "create_proxy_app"):
            monkeypatch.setattr(module, "create_proxy_app", on_postgres)
    yield backend
    with psycopg.connect(url, autocommit=True) as conn:
        for schema in schemas.values():
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


# ---------------------------------------------------------------- a small real file system


@pytest.fixture
def small_disk(tmp_path):
    """An 8 MB tmpfs mounted for the test (skipped, saying why, where none can be mounted)."""
    from tests.small_disk import mounted_tmpfs

    yield from mounted_tmpfs(tmp_path / "disk", "8m")
