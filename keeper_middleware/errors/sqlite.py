"""SQLite files that fail under a running keeper: every failure an ``ArchiveError`` that names
the file and says what to do, and a file deleted or replaced under it found before it writes.

A full disk, an I/O error, a damaged page or a lock held too long used to surface as a bare
``sqlite3.OperationalError`` or ``DatabaseError`` from deep inside a step. And SQLite keeps
writing to a file that was deleted while it was open (the inode lives on until it is closed):
every cut was acknowledged, and after a restart the turns were gone. :class:`FileConnection`
(a ``sqlite3.connect(..., factory=FileConnection)``) translates the errors of every statement
and every fetch, and, once told which file it opened (:meth:`FileConnection.watch`), checks
before each statement outside a transaction that the path still names that file.

Stdlib and the error tree only, so the keyword index (``retrievers/keyword.py``) uses it too.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable
from typing import Any

from keeper_middleware.errors import ArchiveError

__all__ = ["FileConnection", "FileCursor", "describe"]


def describe(path: str, exc: sqlite3.Error, *, what: str = "the archive") -> str:
    """What went wrong with the SQLite file at ``path``, and what to do about it."""
    text = str(exc)
    name = str(getattr(exc, "sqlite_errorname", "") or "")
    if name.startswith("SQLITE_FULL") or "disk is full" in text:
        return (
            f"{what} {path!r} cannot be written: its disk is full ({text}). Nothing of this "
            "write was kept (the transaction rolled back); free space on that file system, or "
            "move the file to a bigger one, then run the step again"
        )
    if name.startswith("SQLITE_READONLY") or "readonly" in text or "read-only" in text:
        return (
            f"cannot write {what} {path!r}: it is read-only ({text}), and the keeper writes to "
            "it at every cut; make the file and its folder writable (SQLite adds -wal and -shm "
            "files beside it), or open a writable copy"
        )
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) or "malformed" in text:
        return (
            f"{what} {path!r} is damaged ({text}): restore it from a backup, or move it away "
            "and start a new file (the graph's checkpoints still hold what was in view)"
        )
    if "not a database" in text:
        return (
            f"cannot open {what} {path!r}: it is not a keeper archive ({text}); point "
            "archive= at a new file, or move this one away"
        )
    if name.startswith("SQLITE_IOERR") or "disk I/O error" in text:
        return (
            f"{what} {path!r} could not be read or written: the disk reported an error "
            f"({text}); check the disk and the file system it is on, then run the step again"
        )
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in text:
        return (
            f"{what} {path!r} stayed locked by another connection past the timeout ({text}); "
            "find the process that holds it, or raise the timeout"
        )
    if name.startswith("SQLITE_CANTOPEN") or "unable to open" in text:
        return (
            f"cannot open {what} {path!r} ({text}): check that its folder exists and can be written"
        )
    return f"{what} {path!r} failed: {text}"


def _translated(connection: sqlite3.Connection, exc: sqlite3.Error) -> BaseException:
    if type(exc) in (sqlite3.OperationalError, sqlite3.DatabaseError):
        path = getattr(connection, "path", "?")
        what = getattr(connection, "what", "the archive")
        return ArchiveError(describe(path, exc, what=what))
    return exc  # a constraint or a misuse is a bug of ours, not a fault of the file


class FileCursor(sqlite3.Cursor):
    """A cursor whose statements and fetches fail as ``ArchiveError``s."""

    def execute(self, sql: str, parameters: Any = (), /) -> FileCursor:
        try:
            super().execute(sql, parameters)
        except sqlite3.Error as exc:
            raise _translated(self.connection, exc) from exc
        return self

    def executemany(self, sql: str, seq_of_parameters: Iterable[Any], /) -> FileCursor:
        try:
            super().executemany(sql, seq_of_parameters)
        except sqlite3.Error as exc:
            raise _translated(self.connection, exc) from exc
        return self

    def fetchone(self) -> Any:
        try:
            return super().fetchone()
        except sqlite3.Error as exc:
            raise _translated(self.connection, exc) from exc

    def fetchmany(self, size: int | None = 1) -> list[Any]:
        try:
            return super().fetchmany(size)
        except sqlite3.Error as exc:
            raise _translated(self.connection, exc) from exc

    def fetchall(self) -> list[Any]:
        try:
            return super().fetchall()
        except sqlite3.Error as exc:
            raise _translated(self.connection, exc) from exc

    def __next__(self) -> Any:
        try:
            return super().__next__()
        except sqlite3.Error as exc:
            raise _translated(self.connection, exc) from exc


class FileConnection(sqlite3.Connection):
    """A connection whose failures are ``ArchiveError``s naming the file; once watching, it
    refuses any statement outside a transaction when its path no longer names the file it
    opened (checked with one ``stat``, before the statement runs)."""

    path: str = "?"
    what: str = "the archive"
    _identity: tuple[int, int] | None = None

    def name_file(self, path: str, what: str) -> None:
        """Say which file this is (for messages), without watching it."""
        self.path, self.what = path, what

    def watch(self, path: str, what: str = "the archive") -> None:
        """Remember which file ``path`` names now; from here on it must keep naming it."""
        self.name_file(path, what)
        stat = os.stat(path)
        self._identity = (stat.st_dev, stat.st_ino)

    def check_file(self) -> None:
        """Refuse to go on when the watched path was deleted or now names another file."""
        if self._identity is None or self.in_transaction:
            return
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            raise ArchiveError(
                f"{self.what} file {self.path!r} was deleted while this keeper had it open: "
                "nothing more is written to it, since a write would be acknowledged and then "
                "lost with the file. This process still holds what it archived: save it with "
                f"archive.rescue({self.path!r}) (keeper.archive), or restore the file from a "
                "backup; then restart the keeper on it and run the step again"
            ) from None
        except OSError as exc:
            raise ArchiveError(
                f"{self.what} file {self.path!r} can no longer be checked ({exc}); check the "
                "disk and the folder it is in"
            ) from exc
        if (stat.st_dev, stat.st_ino) != self._identity:
            raise ArchiveError(
                f"{self.what} file {self.path!r} was replaced by another file while this keeper "
                "had it open: nothing more is written to either, since writes to the old file "
                "would be acknowledged and then lost. Save what this process archived with "
                "archive.rescue('another/path.sqlite3') (keeper.archive) and decide which file "
                "to keep; then restart the keeper on it"
            )

    def execute(self, sql: str, parameters: Any = (), /) -> FileCursor:
        self.check_file()
        return self.cursor(FileCursor).execute(sql, parameters)

    def executemany(self, sql: str, seq_of_parameters: Iterable[Any], /) -> FileCursor:
        self.check_file()
        return self.cursor(FileCursor).executemany(sql, seq_of_parameters)
