"""What the keeper adds next to a new question: the RULES, and optionally retrieved sentences.

Both are written once into the history and never re-rendered, so they are byte-identical in
every later request while they stay in view (the server's prefix cache depends on it).
"""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.messages import BaseMessage

from keeper_middleware.messages.facts import text_of
from keeper_middleware.retrievers.base import Hit
from keeper_middleware.retrievers.passages import excerpt

RULES_TAG = "[RULES]"
RETRIEVED_TAG = "[RETRIEVED]"


def render_rules_block(rules: Sequence[str]) -> str:
    """The reminder placed right after a new question set (docs/formats.md §3)."""
    lines = [f"{RULES_TAG} Rules in force (from the NOTES):"]
    lines.extend(f"- {rule}" for rule in rules)
    return "\n".join(lines)


def question_queries(message: BaseMessage) -> list[str]:
    """The separate questions in a question set: its lines that end in '?', else the whole text."""
    lines = [line.strip() for line in text_of(message).splitlines()]
    questions = [line for line in lines if line.endswith("?")]
    return questions or [text_of(message).strip()]


def render_retrieved_block(hits: Sequence[Hit]) -> str:
    """Retrieved archive sentences, each with the sentence that follows it, in item order."""
    if not hits:
        return f"{RETRIEVED_TAG} No archived sentences match these questions."
    lines = [f"{RETRIEVED_TAG} Archived sentences that best match these questions:"]
    for hit in sorted(hits, key=lambda h: (h.passage.item, h.passage.position)):
        lines.append(f"item {hit.passage.item}: {excerpt(hit)}")
    return "\n".join(lines)


def merge_hits(per_query: Sequence[Sequence[Hit]], limit: int) -> list[Hit]:
    """Round-robin over the queries' results so every question gets its best matches shown."""
    seen: set[tuple[str, int]] = set()
    merged: list[Hit] = []
    depth = max((len(h) for h in per_query), default=0)
    for rank in range(depth):
        for hits in per_query:
            if rank < len(hits):
                hit = hits[rank]
                key = (hit.passage.session, hit.passage.position)
                if key not in seen:
                    seen.add(key)
                    merged.append(hit)
                    if len(merged) >= limit:
                        return merged
    return merged
