"""How a thread's step starts, said out loud when it is set up to lose something silently.

Three set-ups run without an error and still lose what the user expects to keep:

- a thread that starts afresh (no keeper state) over an archive that already holds its turns: the
  graph's state was lost while the archive lived on, so this start does not see those turns;
- a graph run with no checkpointer over an archive kept on disk or in a database: each
  ``invoke`` then starts the thread afresh (the model sees only that call's messages), nothing
  accumulates to be archived, and a second run of the program cannot continue the thread;
- a synchronous ``invoke`` inside a running event loop: every keeper step (archive writes,
  index reads, note calls) blocks that loop, and everything else it serves waits.

Each is one WARNING on the ``keeper_middleware`` logger that says what to do, logged once per
keeper and thread (the event loop: once per process), never an error: each can be meant (a
throwaway thread id). A notebook's cell runs inside the kernel's event loop and a sync
``invoke`` there blocks nothing else: no warning in an IPython kernel.
"""

from __future__ import annotations

import asyncio
import logging
import sys

from langgraph.config import get_config

from keeper_middleware.archive.store import ArchiveStore

log = logging.getLogger(__name__)

CHECKPOINTER_KEY = "__pregel_checkpointer"
"""Where a LangGraph run's config carries its checkpointer (``langgraph``'s
``CONFIG_KEY_CHECKPOINTER``; absent when the graph was compiled without one)."""


def archive_location(archive: ArchiveStore) -> str | None:
    """Where ``archive`` outlives the process (a file path, a database URL), else ``None``."""
    url = getattr(archive, "url", None)
    if isinstance(url, str):
        scheme, _, rest = url.partition("://")
        return f"{scheme}://{rest.rpartition('@')[2]}"  # never the password
    path = getattr(archive, "path", None)
    if isinstance(path, str) and path != ":memory:":
        return path
    return None


def run_keeps_checkpoints() -> bool | None:
    """Whether the LangGraph run this step belongs to has a checkpointer; ``None`` outside a
    graph run (the proxy, a step called directly), where the host keeps the state itself."""
    try:
        config = get_config()
    except RuntimeError:
        return None
    configurable = config.get("configurable") or {}
    return configurable.get(CHECKPOINTER_KEY) is not None


def in_running_loop() -> bool:
    """Whether this thread is running an asyncio event loop (a sync step here blocks it)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def in_ipython_kernel() -> bool:
    """Whether this is an IPython shell or notebook kernel, whose loop a cell may block."""
    ipython = sys.modules.get("IPython")
    get_ipython = getattr(ipython, "get_ipython", None)
    return callable(get_ipython) and get_ipython() is not None


_loop_said = False
"""Whether the event-loop warning was logged in this process (once is enough to act on it)."""


class StartWarnings:
    """The warnings above for one keeper, each logged once (per thread where it is a thread's)."""

    def __init__(self, archive: ArchiveStore) -> None:
        self.archive = archive
        self.location = archive_location(archive)
        self._unchecked: set[str] = set()
        self._afresh: set[str] = set()

    def sync_step(self, session: str) -> None:
        """A synchronous step is starting: inside a running event loop, say to use ``ainvoke``."""
        global _loop_said
        if _loop_said or not in_running_loop() or in_ipython_kernel():
            return
        _loop_said = True
        log.warning(
            "session=%s: a synchronous keeper step runs inside a running event loop, which it "
            "blocks (archive, index and note calls) until it ends: in async code call the "
            "graph's ainvoke/astream (the keeper's async path runs its I/O in worker threads)",
            session,
        )

    def fresh_state(self, session: str, *, names_branch: bool = False) -> None:
        """The step found no keeper state for ``session``: the thread starts afresh.

        Args:
            session: the thread id.
            names_branch: NOTES in view name a branch of the archive (a parent graph handed
                the keeper's messages back), so the thread continues and is not afresh.
        """
        if self.location is not None and run_keeps_checkpoints() is False:
            self._without_checkpointer(session)
        if names_branch or session in self._afresh:
            return
        archived = self.archive.turn_count(session)
        if archived:
            self._afresh.add(session)
            log.warning(
                "session=%s starts afresh but its archive already holds %d turns, which this "
                "new start does not see: the graph state was lost (no checkpointer, or an "
                "in-memory one, with a file archive?). Pair the archive with a persistent "
                "checkpointer (SqliteSaver), or use a new thread id",
                session,
                archived,
            )

    def _without_checkpointer(self, session: str) -> None:
        if session in self._unchecked:
            return
        self._unchecked.add(session)
        log.warning(
            "session=%s runs in a graph with no checkpointer over the archive %s: each invoke "
            "starts the thread afresh (the model sees only that call's messages) and a later "
            "run cannot continue it. Compile the graph with a persistent checkpointer "
            "(create_keeper_agent(..., checkpointer=SqliteSaver(...)), or "
            "graph.compile(checkpointer=...)), or keep the archive in memory (archive=':memory:')",
            session,
            self.location,
        )
