"""Opening PostgreSQL: the optional import, the URL as it may be shown, and errors that say why.

Every error a user sees names the server it was about, without the password: a URL pasted into
a log or an issue must not leak a credential.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from keeper_middleware.errors import ArchiveError, ConfigurationError, MissingDependencyError

URL_SCHEMES = ("postgresql://", "postgres://")
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_PASSWORD_PAIR = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def is_postgres_url(value: object) -> bool:
    """Whether a value names a PostgreSQL database (``postgresql://…`` or ``postgres://…``)."""
    return isinstance(value, str) and value.strip().lower().startswith(URL_SCHEMES)


def redact_url(url: str) -> str:
    """The URL with its password (in the authority or as a parameter) replaced by ``***``."""
    if not is_postgres_url(url):
        return _PASSWORD_PAIR.sub(r"\1***", url)
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostinfo = netloc.rpartition("@")
        user, has_password, _ = userinfo.partition(":")
        netloc = f"{user}:***@{hostinfo}" if has_password else netloc
    query = urlencode(
        [(k, "***" if k.lower() == "password" else v) for k, v in parse_qsl(parts.query)],
        safe="*",
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def split_schema(url: str) -> tuple[str, str | None]:
    """The URL without a ``schema=`` parameter, and that parameter (PostgreSQL itself does not
    know it: it chooses where the archive's tables go, so one database can hold several)."""
    if not is_postgres_url(url):
        return url, None
    parts = urlsplit(url)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    schema = next((v for k, v in pairs if k == "schema"), None)
    if schema is None:
        return url, None
    query = urlencode([(k, v) for k, v in pairs if k != "schema"])
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment)), schema


def check_schema_name(schema: str) -> str:
    """A schema name used unquoted in SQL: lowercase letters, digits and _, at most 63."""
    if not isinstance(schema, str) or not _IDENTIFIER.fullmatch(schema):
        raise ConfigurationError(
            f"schema must be 1 to 63 of a-z, 0-9 and _, starting with a letter or _, got "
            f"{schema!r}: e.g. 'keeper' or 'tenant_a'"
        )
    return schema


def require_psycopg() -> Any:
    """The psycopg module, or an error naming the extra that installs it."""
    try:
        import psycopg
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        raise MissingDependencyError("psycopg", "postgres") from exc
    return psycopg


@contextmanager
def translated_errors(url: str, doing: str) -> Iterator[None]:
    """Turn psycopg's connection, permission, pool, disk and damaged-data errors into
    ``ArchiveError``s that name the server (without its password) and say what to do."""
    psycopg = require_psycopg()
    from psycopg_pool import PoolTimeout

    shown = redact_url(url)
    try:
        yield
    except PoolTimeout as exc:
        raise ArchiveError(
            f"no connection to the PostgreSQL archive at {shown} came free while {doing}: the "
            f"server is down or every pooled connection is busy ({exc}); check the server, or "
            "raise max_size"
        ) from exc
    except psycopg.errors.InsufficientPrivilege as exc:
        raise ArchiveError(
            f"the role connecting to {shown} may not do this while {doing}: "
            f"{_first_line(exc)}; grant it CREATE on the database (or create the schema and "
            "grant it ALL on the schema), or connect as the schema's owner"
        ) from exc
    except psycopg.errors.DiskFull as exc:
        raise ArchiveError(
            f"the PostgreSQL archive at {shown} has no disk space left while {doing}: "
            f"{_first_line(exc)}. Nothing of this write was kept (the transaction rolled "
            "back); free space on the server (or its tablespace), then run the step again"
        ) from exc
    except (psycopg.errors.DataCorrupted, psycopg.errors.IndexCorrupted) as exc:
        raise ArchiveError(
            f"the PostgreSQL archive at {shown} reports damaged data while {doing}: "
            f"{_first_line(exc)}; restore the database from a backup (REINDEX for a damaged "
            "index), then run the step again"
        ) from exc
    except psycopg.errors.ReadOnlySqlTransaction as exc:
        raise ArchiveError(
            f"the PostgreSQL archive at {shown} is read-only while {doing} (a standby?): "
            f"{_first_line(exc)}; connect to the primary server"
        ) from exc
    except psycopg.OperationalError as exc:
        raise ArchiveError(
            f"cannot reach the PostgreSQL archive at {shown} while {doing}: {_first_line(exc)}"
        ) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def connect(url: str, *, timeout: float) -> Any:
    """One autocommit ``psycopg.Connection``, or an ``ArchiveError`` that says why not."""
    psycopg = require_psycopg()
    with translated_errors(url, "connecting"):
        conn = psycopg.connect(url, autocommit=True, connect_timeout=max(1, round(timeout)))
    return conn
