"""LoCoMo (Maharana et al., ACL 2024) in the benchmark: a loader for the dataset's file, retrieval
recall with no model, and arms answering its questions with a model, graded as the paper does.
"""

from keeper_bench.locomo.dataset import (
    Conversation,
    LocomoFormatError,
    Question,
    Session,
    Turn,
    load_locomo,
    split_evidence,
)

__all__ = [
    "Conversation",
    "LocomoFormatError",
    "Question",
    "Session",
    "Turn",
    "load_locomo",
    "split_evidence",
]
