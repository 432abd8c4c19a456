"""The archive on PostgreSQL, for agents and proxy replicas spread over several machines.

Needs the ``postgres`` extra (psycopg 3 and psycopg-pool)::

    pip install 'keeper-middleware[postgres]'
    Keeper(archive="postgresql://keeper:secret@db:5432/agents")
"""

from keeper_middleware.archive.postgres.archive import PostgresArchive
from keeper_middleware.archive.postgres.connect import is_postgres_url, redact_url
from keeper_middleware.archive.postgres.locks import session_lock_key
from keeper_middleware.archive.postgres.schema import MIGRATIONS

__all__ = ["MIGRATIONS", "PostgresArchive", "is_postgres_url", "redact_url", "session_lock_key"]
