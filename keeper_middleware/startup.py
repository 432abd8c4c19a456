"""What a long-running host does once, when start-up is over: take the objects that live as long
as the process out of the garbage collector's sight.

A full collection walks every object the collector tracks. After importing LangChain, LangGraph
and the keeper that is some 130,000 objects that never die (the imported modules, the compiled
graph), so each full collection costs 30-65 ms of CPU on a 2-core machine, and it runs inside
whichever step's allocation sets it off. Frozen, they are skipped: along a 10M-token notes run
the full collections took 0.31 s instead of 1.99 s (``bench/results/notes_cost.md``). The keeper
never does this by itself: the collector is the host's, so the host decides (``keeper-proxy``
does before it serves; ``keeper-bench notes-cost`` before it runs).
"""

from __future__ import annotations

import gc


def freeze_startup_objects() -> int:
    """Collects once, then freezes every object alive now for the life of the process; returns
    how many objects the collector no longer walks. Call it once, after start-up and before the
    first request: whatever is frozen is never collected, so freezing again later would keep
    garbage alive."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
