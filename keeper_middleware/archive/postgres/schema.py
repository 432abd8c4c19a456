"""The archive's tables in PostgreSQL, as numbered migrations.

Like LangGraph's ``PostgresSaver``: ``MIGRATIONS`` is a list of statements, the database records
the highest one applied (``keeper_migrations``), and ``setup`` runs the rest in order, each with
its record in one transaction. Two replicas starting at once serialise on an advisory lock, so a
statement never runs twice. A database that has run a newer list than this version knows is
refused (an older keeper must not write to tables it does not understand); a schema that holds
tables but no migration record is someone else's and is refused too.

Text that is archived word for word (contents, reasoning, NOTES) is stored as UTF-8 ``bytea``:
PostgreSQL's ``text`` cannot hold the NUL character, and an archive keeps any message as sent.
"""

from __future__ import annotations

from typing import Any

from keeper_middleware.archive.postgres.connect import redact_url
from keeper_middleware.errors import ArchiveSchemaError

MIGRATIONS: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS {schema}.keeper_migrations (v INTEGER PRIMARY KEY)""",
    """CREATE TABLE {schema}.sessions (
        session TEXT PRIMARY KEY,
        next_seq BIGINT NOT NULL DEFAULT 0,
        next_version INTEGER NOT NULL DEFAULT 1
    )""",
    """CREATE TABLE {schema}.cuts (
        session TEXT NOT NULL REFERENCES {schema}.sessions (session) ON DELETE CASCADE,
        cut_key TEXT NOT NULL,
        turns_archived INTEGER NOT NULL,
        notes_version INTEGER,
        created DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (session, cut_key)
    )""",
    """CREATE TABLE {schema}.turns (
        session TEXT NOT NULL,
        seq BIGINT NOT NULL,
        msg_id TEXT NOT NULL,
        item BIGINT,
        role TEXT NOT NULL,
        content BYTEA NOT NULL,
        tool_calls_json TEXT NOT NULL,
        tool_call_id TEXT,
        name TEXT,
        reasoning BYTEA NOT NULL,
        cut_key TEXT NOT NULL,
        PRIMARY KEY (session, seq),
        UNIQUE (session, msg_id),
        FOREIGN KEY (session, cut_key) REFERENCES {schema}.cuts (session, cut_key)
            ON DELETE CASCADE
    )""",
    """CREATE INDEX turns_by_item ON {schema}.turns (session, item, seq)""",
    """CREATE TABLE {schema}.notes (
        session TEXT NOT NULL,
        version INTEGER NOT NULL,
        first_item BIGINT,
        last_item BIGINT,
        text BYTEA NOT NULL,
        data_json TEXT NOT NULL,
        cut_key TEXT NOT NULL,
        created DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (session, version),
        FOREIGN KEY (session, cut_key) REFERENCES {schema}.cuts (session, cut_key)
            ON DELETE CASCADE
    )""",
    """CREATE TABLE {schema}.kv (
        session TEXT NOT NULL REFERENCES {schema}.sessions (session) ON DELETE CASCADE,
        key TEXT NOT NULL,
        value_json TEXT NOT NULL,
        PRIMARY KEY (session, key)
    )""",
    # moved STATE entries, one row each (``value`` NULL: moved, nothing to recall); sessions
    # that kept them as two JSON values in kv are adopted on first use (``postgres.moved``)
    """CREATE TABLE {schema}.moved (
        session TEXT NOT NULL REFERENCES {schema}.sessions (session) ON DELETE CASCADE,
        key BYTEA NOT NULL,
        value BYTEA,
        seq BIGINT NOT NULL,
        folded BYTEA NOT NULL,
        word BYTEA,
        PRIMARY KEY (session, key)
    )""",
    """CREATE INDEX moved_by_word ON {schema}.moved (session, word)""",
    """CREATE INDEX moved_by_folded ON {schema}.moved (session, folded)""",
    """CREATE INDEX moved_by_seq ON {schema}.moved (session, seq)""",
    # branches (docs/branches.md): cuts chained to their parents, records named by message id
    # and digest, links to records another branch archived first, moved entries as a log
    """ALTER TABLE {schema}.sessions ADD COLUMN tip TEXT,
        ADD COLUMN forked BOOLEAN NOT NULL DEFAULT false,
        ADD COLUMN cuts INTEGER NOT NULL DEFAULT 0""",
    """ALTER TABLE {schema}.cuts ADD COLUMN parent TEXT,
        ADD COLUMN ordinal INTEGER NOT NULL DEFAULT 0,
        ADD COLUMN first_seq BIGINT NOT NULL DEFAULT 0,
        ADD COLUMN notes_at INTEGER""",
    # a session was one line of cuts: its order is the order of their records, else of their
    # notes versions, else of their times; each cut's parent is the one before it
    """WITH firsts AS (
        SELECT session, cut_key, MIN(seq) AS first FROM {schema}.turns
        GROUP BY session, cut_key
    ), ordered AS (
        SELECT c.session, c.cut_key, COALESCE(f.first, 0) AS first,
            ROW_NUMBER() OVER (PARTITION BY c.session
                ORDER BY f.first NULLS LAST, c.notes_version NULLS LAST, c.created, c.cut_key)
                AS ordinal
        FROM {schema}.cuts AS c LEFT JOIN firsts AS f
            ON f.session = c.session AND f.cut_key = c.cut_key
    ), chained AS (
        SELECT o.session, o.cut_key, o.first, o.ordinal,
            LAG(o.cut_key) OVER (PARTITION BY o.session ORDER BY o.ordinal) AS parent,
            MAX(c.notes_version) OVER (PARTITION BY o.session ORDER BY o.ordinal
                ROWS UNBOUNDED PRECEDING) AS notes_at
        FROM ordered AS o JOIN {schema}.cuts AS c
            ON c.session = o.session AND c.cut_key = o.cut_key
    )
    UPDATE {schema}.cuts AS c SET parent = ch.parent, ordinal = ch.ordinal,
        first_seq = ch.first, notes_at = ch.notes_at
    FROM chained AS ch WHERE c.session = ch.session AND c.cut_key = ch.cut_key""",
    """UPDATE {schema}.sessions AS s SET cuts = n.cuts, tip = n.tip
    FROM (SELECT DISTINCT ON (session) session, ordinal AS cuts, cut_key AS tip
          FROM {schema}.cuts ORDER BY session, ordinal DESC) AS n
    WHERE s.session = n.session""",
    """ALTER TABLE {schema}.turns ADD COLUMN digest TEXT, ADD COLUMN position BIGINT""",
    # the same digest as ``records.turn_digest``, over the same bytes
    """UPDATE {schema}.turns SET digest = left(encode(sha256(
        (CASE WHEN item IS NULL THEN decode('2d', 'hex') ELSE convert_to('+' || item::text, 'UTF8') END)
        || decode('1f', 'hex') || convert_to(role, 'UTF8')
        || decode('1f', 'hex') || content
        || decode('1f', 'hex') || convert_to(tool_calls_json, 'UTF8')
        || decode('1f', 'hex') || (CASE WHEN tool_call_id IS NULL THEN decode('2d', 'hex')
            ELSE convert_to('+' || tool_call_id, 'UTF8') END)
        || decode('1f', 'hex') || (CASE WHEN name IS NULL THEN decode('2d', 'hex')
            ELSE convert_to('+' || name, 'UTF8') END)
        || decode('1f', 'hex') || reasoning), 'hex'), 32)""",
    """ALTER TABLE {schema}.turns ALTER COLUMN digest SET NOT NULL,
        DROP CONSTRAINT turns_session_msg_id_key,
        ADD CONSTRAINT turns_session_msg_id_digest_key UNIQUE (session, msg_id, digest)""",
    """CREATE INDEX cuts_by_ordinal ON {schema}.cuts (session, ordinal)""",
    """CREATE TABLE {schema}.links (
        session TEXT NOT NULL,
        cut_key TEXT NOT NULL,
        seq BIGINT NOT NULL,
        place INTEGER NOT NULL,
        PRIMARY KEY (session, cut_key, seq),
        FOREIGN KEY (session, cut_key) REFERENCES {schema}.cuts (session, cut_key)
            ON DELETE CASCADE
    )""",
    """CREATE TABLE {schema}.moved_log (
        session TEXT NOT NULL REFERENCES {schema}.sessions (session) ON DELETE CASCADE,
        id BIGINT NOT NULL,
        ordinal INTEGER NOT NULL,
        key BYTEA NOT NULL,
        value BYTEA,
        gone BOOLEAN NOT NULL DEFAULT false,
        place BIGINT NOT NULL,
        folded BYTEA NOT NULL,
        word BYTEA,
        PRIMARY KEY (session, id)
    )""",
    """CREATE INDEX moved_log_by_word ON {schema}.moved_log (session, word)""",
    """CREATE INDEX moved_log_by_folded ON {schema}.moved_log (session, folded)""",
    """CREATE INDEX moved_log_by_key ON {schema}.moved_log (session, key)""",
    # the latest state of each moved key starts the log as of the session's latest cut (the
    # table stays: a session that never forked keeps reading its current rows there)
    """INSERT INTO {schema}.moved_log (session, id, ordinal, key, value, gone, place, folded, word)
    SELECT m.session, m.seq + 1, s.cuts, m.key, m.value, false, m.seq, m.folded, m.word
    FROM {schema}.moved AS m JOIN {schema}.sessions AS s ON s.session = m.session""",
    # handles (``archive.handles``): opaque names standing for a session, erased with it
    """CREATE TABLE {schema}.handles (
        handle TEXT PRIMARY KEY,
        session TEXT NOT NULL REFERENCES {schema}.sessions (session) ON DELETE CASCADE,
        value_json TEXT NOT NULL,
        created DOUBLE PRECISION NOT NULL
    )""",
)
"""Append only: a released statement is never edited, a change is a new statement."""

BRANCHES_MIGRATION = 11
"""The first migration of branches (docs/branches.md); the ones before it are 0.2's."""

SETUP_LOCK = 0x6B656570  # "keep": serialises setup across processes (two-int advisory key)


def setup(conn: Any, schema: str, url: str) -> int:
    """Bring ``schema`` up to the newest migration; returns the version it is at.

    ``conn`` is an autocommit psycopg connection.
    """
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (SETUP_LOCK, schema))
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        tables = {
            row[0]
            for row in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                (schema,),
            )
        }
        if tables and "keeper_migrations" not in tables:
            raise ArchiveSchemaError(
                f"the schema {schema!r} at {redact_url(url)} holds tables that are not a keeper "
                f"archive ({', '.join(sorted(tables)[:5])}): pass another schema=, e.g. 'keeper'"
            )
        conn.execute(MIGRATIONS[0].format(schema=schema))
        row = conn.execute(f"SELECT MAX(v) FROM {schema}.keeper_migrations").fetchone()
        applied = -1 if row[0] is None else int(row[0])
        newest = len(MIGRATIONS) - 1
        if applied > newest:
            raise ArchiveSchemaError(
                f"the archive in schema {schema!r} at {redact_url(url)} is at migration "
                f"{applied}, but this keeper-middleware knows up to {newest}: upgrade "
                "keeper-middleware or use another schema"
            )
        for version in range(applied + 1, len(MIGRATIONS)):
            conn.execute(MIGRATIONS[version].format(schema=schema))
            conn.execute(f"INSERT INTO {schema}.keeper_migrations (v) VALUES (%s)", (version,))
        return newest
