"""``keeper-archive``: look into an archive, and move a SQLite archive into PostgreSQL.

    keeper-archive info keeper-proxy-data/keeper.sqlite3
    keeper-archive info postgresql://keeper@db/agents
    keeper-archive migrate keeper-proxy-data postgresql://keeper@db/agents

``migrate`` reads the source only; run it again to finish one that was stopped.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from keeper_middleware.archive.store import ArchiveStore, open_archive
from keeper_middleware.errors import KeeperError


def _info(target: str, schema: str | None) -> int:
    archive: ArchiveStore
    if target.lower().startswith(("postgresql://", "postgres://")):
        from keeper_middleware.archive.postgres.archive import PostgresArchive

        archive = PostgresArchive(target, schema=schema)
    else:
        from keeper_middleware.archive.postgres.migrate import source_file

        archive = open_archive(source_file(target))
    with archive:
        print(f"{'session':<40} {'turns':>8} {'notes versions':>15}")
        for session in archive.sessions():
            versions = sum(1 for _ in archive.notes_versions(session))
            print(f"{session:<40} {archive.turn_count(session):>8} {versions:>15}")
    return 0


def _migrate(source: str, url: str, schema: str | None, sessions: list[str] | None) -> int:
    from keeper_middleware.archive.postgres.connect import redact_url
    from keeper_middleware.archive.postgres.migrate import SessionCopy, migrate

    def report(copy: SessionCopy) -> None:
        print(
            f"{copy.session}: {copy.cuts} cuts ({copy.cuts_copied} copied now), {copy.turns} "
            f"turns, {copy.notes_versions} notes versions, {copy.values} values, "
            f"{copy.passages} passages indexed",
            flush=True,
        )

    copies = migrate(source, url, schema=schema, sessions=sessions, report=report)
    turns = sum(c.turns for c in copies)
    print(f"done: {len(copies)} sessions, {turns} turns in {redact_url(url)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="keeper-archive", description=(__doc__ or "").splitlines()[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    info = commands.add_parser("info", help="sessions, turns and notes versions of an archive")
    info.add_argument("target", help="a SQLite archive file or folder, or a postgresql:// URL")
    info.add_argument("--schema", help="PostgreSQL schema (default keeper, or ?schema= in the URL)")
    move = commands.add_parser(
        "migrate", help="copy a SQLite archive (file or keeper-proxy folder) into PostgreSQL"
    )
    move.add_argument("source", help="the SQLite archive file, or keeper-proxy's --archive-dir")
    move.add_argument("url", help="postgresql://user:password@host:5432/dbname")
    move.add_argument("--schema", help="target schema (default keeper, or ?schema= in the URL)")
    move.add_argument(
        "--session", action="append", dest="sessions", help="only this session (repeatable)"
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "info":
            return _info(args.target, args.schema)
        return _migrate(args.source, args.url, args.schema, args.sessions)
    except (KeeperError, ValueError) as exc:
        print(f"keeper-archive: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
