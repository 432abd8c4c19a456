"""The comparison arms: the product's prebuilt graphs and the benchmark's own (peers,
self-editing), behind one ``build_arm``."""

from keeper_bench.arms.registry import (
    ARM_OPTIONS,
    ARMS,
    BENCH_ARMS,
    PEER_SETTINGS,
    SELF_EDIT_STYLES,
    SHARED_OPTIONS,
    Arm,
    ArmInfo,
    build_arm,
    default_retrieved_per_question,
    matched_summary_tokens,
)

__all__ = [
    "ARMS",
    "ARM_OPTIONS",
    "BENCH_ARMS",
    "PEER_SETTINGS",
    "SELF_EDIT_STYLES",
    "SHARED_OPTIONS",
    "Arm",
    "ArmInfo",
    "build_arm",
    "default_retrieved_per_question",
    "matched_summary_tokens",
]
