"""The keeper's errors, in one small tree.

    KeeperError
    ├── ConfigurationError      a setting is wrong; the message says which and how to fix it
    │   └── ToolsNotSupportedError  the chat model or its server cannot take tools (search=False)
    ├── MissingDependencyError  an optional extra is not installed; the message gives the pip command
    │                           (``retrievers.MissingExtraError`` is the same class)
    ├── WindowTooSmallError     what must stay in view does not fit the live window even after a cut
    ├── ArchiveError            the archive or its index cannot be used; the message names the path
    │   └── ArchiveSchemaError  the file was written by a newer version
    ├── RetrieverError          a retrieval backend failed (retrievers/base.py)
    │   └── ServerUnavailableError  a configured search server did not answer
    └── TokenizeEndpointError   a server's tokenize endpoint is down or answers wrongly (tokens.py)

Configuration errors are raised eagerly, at construction, so a tool-calling loop (where LangGraph's
ToolNode turns exceptions into messages for the model) never swallows them.
"""

from __future__ import annotations


class KeeperError(Exception):
    """Base class of every error the keeper raises on purpose."""


class ConfigurationError(KeeperError, ValueError):
    """A setting is invalid."""


class ToolsNotSupportedError(ConfigurationError):
    """The chat model cannot bind tools, or its server refuses requests that carry them."""


class MissingDependencyError(KeeperError, ImportError):
    """An optional dependency is missing."""

    def __init__(self, package: str, extra: str, *, needed_by: str | None = None) -> None:
        what = f"{needed_by} needs {package}" if needed_by else f"{package} is not installed"
        super().__init__(
            f"{what}; install it with: pip install 'keeper-middleware[{extra}]'", name=package
        )
        self.package = package
        self.extra = extra


class WindowTooSmallError(KeeperError):
    """What must stay in view (system prompt, task, NOTES, an open question) does not fit."""


class ArchiveError(KeeperError):
    """The archive (or its search index) cannot be opened or written."""


class ArchiveSchemaError(ArchiveError):
    """The archive file was written by a newer version of keeper-middleware."""
