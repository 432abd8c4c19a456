"""The archive's layout version, kept apart so the backends can read it without importing the
storage contract that opens them (``archive/store.py`` imports the backends)."""

from __future__ import annotations

__all__ = ["SCHEMA_VERSION"]

SCHEMA_VERSION = 2
"""SQLite archive layout: 2 keeps moved STATE entries one row each (``moved_rows``)."""
