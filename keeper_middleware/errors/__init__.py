"""The keeper's errors, in one small tree.

    KeeperError
    ├── ConfigurationError      (ValueError) a setting or an argument has a value the keeper cannot
    │   │                       use; the message names it and says how to fix it
    │   └── ToolsNotSupportedError  the chat model or its server cannot take tools (search=False)
    ├── ArgumentTypeError       (TypeError) an argument is of a type the keeper cannot use; the
    │                           message names it and the types it takes
    ├── MalformedDataError      (ValueError) text or data the keeper reads back (a NOTES message,
    │                           an upstream reply, a slot file) is not in the format it expects
    ├── InvalidStateError       (RuntimeError) an object was used when it cannot be: closed, not
    │                           started, or called out of order
    ├── ServerStartError        (RuntimeError) a server the keeper starts did not come up
    ├── MissingDependencyError  (ImportError) an optional extra is not installed; the message gives
    │                           the pip command (``retrievers.MissingExtraError`` is the same class)
    ├── WindowTooSmallError     what must stay in view does not fit the live window even after a cut
    ├── UnknownSessionError     (LookupError) a thread id this keeper's archive has never seen
    ├── ArchiveError            the archive or its index cannot be used; the message names the path
    │   └── ArchiveSchemaError  the file was written by a newer version
    ├── RetrieverError          a retrieval backend failed (retrievers/base.py)
    │   ├── ServerUnavailableError  (ConnectionError) a configured search server did not answer
    │   └── IndexingFailedError     (RuntimeError) indexing in the background failed
    └── TokenizeEndpointError   a server's tokenize endpoint is down or answers wrongly (tokens.tokenizers)

Each class also is the builtin named beside it, so code that caught ``ValueError``,
``TypeError`` or ``RuntimeError`` before catches the same errors now. Integrations define a few
more under ``KeeperError`` next to their code (the proxy's ``RequestError``, ``UpstreamError``,
``QuotaError``; ``LlamaServerError``, ``PostgresNotAvailableError``, ``SlotParkingError``).

Configuration errors are raised eagerly, at construction, so a tool-calling loop (where LangGraph's
ToolNode turns exceptions into messages for the model) never swallows them.
"""

from __future__ import annotations


class KeeperError(Exception):
    """Base class of every error the keeper raises on purpose."""


class ConfigurationError(KeeperError, ValueError):
    """A setting or an argument has a value the keeper cannot use."""


class ToolsNotSupportedError(ConfigurationError):
    """The chat model cannot bind tools, or its server refuses requests that carry them."""


class ArgumentTypeError(KeeperError, TypeError):
    """An argument is of a type the keeper cannot use."""


class MalformedDataError(KeeperError, ValueError):
    """Text or data read back (a NOTES message, an upstream reply, a slot file) is malformed."""


class InvalidStateError(KeeperError, RuntimeError):
    """An object was used when it cannot be: closed, not started, or called out of order."""


class ServerStartError(KeeperError, RuntimeError):
    """A server the keeper starts (the proxy's own, a local model server) did not come up."""


class MissingDependencyError(KeeperError, ImportError):
    """An optional dependency is missing."""

    def __init__(
        self,
        package: str,
        extra: str,
        *,
        needed_by: str | None = None,
        distribution: str = "keeper-middleware",
    ) -> None:
        what = f"{needed_by} needs {package}" if needed_by else f"{package} is not installed"
        install = f"{distribution}[{extra}]" if extra else distribution
        super().__init__(f"{what}; install it with: pip install '{install}'", name=package)
        self.package = package
        self.extra = extra


class WindowTooSmallError(KeeperError):
    """What must stay in view (system prompt, task, NOTES, an open question) does not fit."""


class UnknownSessionError(KeeperError, LookupError):
    """A thread id (session) this keeper has never run a step for and its archive does not
    hold: asked about it, the keeper says so rather than answering as if it were empty."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ArchiveError(KeeperError):
    """The archive (or its search index) cannot be opened or written."""


class ArchiveSchemaError(ArchiveError):
    """The archive file was written by a newer version of keeper-middleware."""


class UnknownCutError(ArchiveError, KeyError):
    """A branch names a cut the session does not have (the archive was erased or swapped while
    the graph's checkpoints lived on)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def unknown_cut(session: str, cut_key: str) -> UnknownCutError:
    """The error for a branch that names a cut this archive lacks, with what to do."""
    return UnknownCutError(
        f"session {session!r} has no cut {cut_key!r}: its graph state points at a cut this "
        "archive does not hold (was the archive erased or replaced?); open the archive the "
        "thread was run with, or start a new thread"
    )
