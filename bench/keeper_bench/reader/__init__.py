"""The simulated reader: a deterministic, stateless chat model for the benchmark.

It is NOT a language model, and results from it are labelled "simulated reader". It reads only the
messages it is sent (story batches, the NOTES, summaries, [RULES] blocks, retrieved passages,
search results) and answers from them, writes note changes and summaries when asked, searches the
archive when its context lacks a fact, and follows a rule only when the rule is in its context.
One reading skill serves every call of every arm: its parser (``text``) was written from
docs/stream-text.md without the generator's templates, and summaries get the care notes get,
within a budget. The same seeded faults (``ReaderFaults``) reach every call, and context rot
(``ContextRot``) makes it overlook text far back in a long context. It measures what a way of
managing context keeps available to a reader of this skill; see docs/simulated-reader.md.

Modules: ``model`` (the chat model and the choice of reply), ``text`` (reading sentences, rules and
questions), ``messages`` (what each message is), ``logic`` (values, actors and gaps from a view),
``notes`` and ``summary`` (writing memory), ``faults``, ``rot``, ``server`` (over HTTP).
"""

from __future__ import annotations

from keeper_bench.reader.faults import (
    FAULT_PRESETS,
    NO_FAULTS,
    REALISTIC_FAULTS,
    ReaderFaults,
    fault_preset,
)
from keeper_bench.reader.model import (
    DEFAULT_SUMMARY_TOKENS,
    MODEL_NAME,
    Reply,
    SimulatedReader,
)
from keeper_bench.reader.rot import NO_ROT, REALISTIC_ROT, ContextRot

__all__ = [
    "DEFAULT_SUMMARY_TOKENS",
    "FAULT_PRESETS",
    "MODEL_NAME",
    "NO_FAULTS",
    "NO_ROT",
    "REALISTIC_FAULTS",
    "REALISTIC_ROT",
    "ContextRot",
    "ReaderFaults",
    "Reply",
    "SimulatedReader",
    "fault_preset",
]
