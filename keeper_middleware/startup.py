"""What a long-running host does once, when start-up is over: take the objects that live as long
as the process out of the garbage collector's sight.

A full collection walks every object the collector tracks. After importing LangChain, LangGraph
and the keeper that is some 130,000 objects that never die (the imported modules, the compiled
graph), so each full collection costs 30-65 ms of CPU on a 2-core machine, and it runs inside
whichever step's allocation sets it off. Frozen, they are skipped: along a 10M-token notes run
the full collections took 0.31 s instead of 1.99 s (``bench/results/notes_cost.md``). The keeper
never does this by itself: the collector is the host's, so the host decides (``keeper-proxy``
does before it serves; ``keeper-bench notes-cost`` before it runs).

A server also sees each request's parsed body live for the whole request: a history of 5,000
messages is some 15,000 dicts and lists alive at once. With Python's default young-generation
threshold (700 allocations) they are walked by dozens of young collections a request, survive
them all, and reach the old generation, whose growth in turn sets off full collections over
every session the process keeps. :func:`collect_young_less_often` raises that threshold so a
request's temporaries die by reference counting before a young collection sees them
(``bench/results/proxy_overhead.md``).
"""

from __future__ import annotations

import gc

from keeper_middleware.errors import ConfigurationError

SERVER_YOUNG_THRESHOLD = 50_000
"""Allocations between young collections in a server process (Python's default: 700)."""


def freeze_startup_objects() -> int:
    """Collects once, then freezes every object alive now for the life of the process; returns
    how many objects the collector no longer walks. Call it once, after start-up and before the
    first request: whatever is frozen is never collected, so freezing again later would keep
    garbage alive."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def collect_young_less_often(threshold: int = SERVER_YOUNG_THRESHOLD) -> tuple[int, int, int]:
    """Sets the young generation's threshold to ``threshold`` allocations, leaving the older
    generations' as they are; returns the thresholds now in force. Cycles are still collected,
    only in fewer, larger young collections. For a host's start-up, like
    :func:`freeze_startup_objects`: the collector is the process's, not the library's.

    Args:
        threshold: net allocations of tracked objects between young collections.

    Raises:
        ConfigurationError: ``threshold`` is below 1.
    """
    if threshold < 1:
        raise ConfigurationError(
            f"the young generation's threshold must be at least 1, not {threshold}"
        )
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(threshold, middle, old)
    return gc.get_threshold()
