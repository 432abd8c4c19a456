"""The archive's layout version, kept apart so the backends can read it without importing the
storage contract that opens them (``archive/store.py`` imports the backends)."""

from __future__ import annotations

__all__ = ["SCHEMA_VERSION"]

SCHEMA_VERSION = 4
"""SQLite archive layout: 2 keeps moved STATE entries one row each (``moved_rows``); 3 names
records by id and digest, chains cuts to their parents and logs moved entries per cut
(docs/branches.md); 4 adds the handles table (``archive.handles``: the proxy's
response ids)."""
