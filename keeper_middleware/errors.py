"""The keeper's errors, in one small tree.

    KeeperError
    ├── ConfigurationError      a setting is wrong; the message says which and how to fix it
    ├── MissingDependencyError  an optional extra is not installed; the message gives the pip command
    ├── WindowTooSmallError     what must stay in view does not fit the live window even after a cut
    ├── ArchiveError            the archive file cannot be used (unreadable, locked)
    │   └── ArchiveSchemaError  the file was written by a newer version (archive.py)
    └── TokenizeEndpointError   a server's tokenize endpoint is down or answers wrongly (tokens.py)

Configuration errors are raised eagerly, at construction, so a tool-calling loop (where LangGraph's
ToolNode turns exceptions into messages for the model) never swallows them.
"""

from __future__ import annotations


class KeeperError(Exception):
    """Base class of every error the keeper raises on purpose."""


class ConfigurationError(KeeperError, ValueError):
    """A setting is invalid."""


class MissingDependencyError(KeeperError, ImportError):
    """An optional dependency is missing."""

    def __init__(self, package: str, extra: str) -> None:
        super().__init__(
            f"{package} is not installed; install it with: pip install 'keeper-middleware[{extra}]'"
        )
        self.package = package
        self.extra = extra


class WindowTooSmallError(KeeperError):
    """What must stay in view (system prompt, task, NOTES, an open question) does not fit."""


class ArchiveError(KeeperError):
    """The archive cannot be opened or written."""
