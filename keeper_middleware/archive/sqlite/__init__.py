"""The archive in one SQLite file: the default backend, for one machine.

``archive`` holds the backend's transactions, ``open`` how a path becomes a working file (tables,
schema migration, open errors), ``moved`` the STATE entries moved out of the NOTES, one row each.
"""

from keeper_middleware.archive.sqlite.archive import SQLiteArchive

__all__ = ["SQLiteArchive"]
