"""The simulated reader: a deterministic, stateless chat model for the benchmark.

It is NOT a language model, and results from it are labelled "simulated reader". It reads only the
messages it is sent (story batches, the NOTES, [RULES] blocks, retrieved passages, search results)
and answers from them, writes note changes when asked, searches the archive when its context lacks
a fact, and follows a rule only when the rule is in its context. What it measures is what a way of
managing context *keeps available*: an upper bound for any model, in seconds on a CPU. Faults that
real models make can be switched on (`ReaderFaults`).
"""

from __future__ import annotations

from keeper_middleware.bench.reader.faults import NO_FAULTS, ReaderFaults
from keeper_middleware.bench.reader.model import MODEL_NAME, Reply, SimulatedReader

__all__ = ["MODEL_NAME", "NO_FAULTS", "ReaderFaults", "Reply", "SimulatedReader"]
