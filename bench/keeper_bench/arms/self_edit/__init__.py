"""Self-editing memory: the model keeps its own pinned state with tools (Letta/MemGPT's core
memory), with or without an archive of what leaves the window.

``memory`` holds the pure part (the state, its rendering, the edits and their rejections);
``graph`` the context node, the tools node and the compiled graph.
"""

from keeper_bench.arms.self_edit.graph import self_edit_graph
from keeper_bench.arms.self_edit.memory import (
    MEMORY_TOOLS,
    PINNED_TAG,
    RULE_PREFIX,
    PinnedState,
    Style,
    apply_edit,
    render_pinned,
)

__all__ = [
    "MEMORY_TOOLS",
    "PINNED_TAG",
    "RULE_PREFIX",
    "PinnedState",
    "Style",
    "apply_edit",
    "render_pinned",
    "self_edit_graph",
]
