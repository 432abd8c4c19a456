"""How many graph steps the run has left, so a search loop ends with an answer at any recursion
limit.

A model that searches with a new query each time is stopped by the search budget, but each
search costs a graph step for the model, one for the tools and one for what runs before the
model (the keeper): ten searches and the stop line took 35 steps, and a run with
``recursion_limit`` 25 to 34 (25 was LangGraph's default for years) ended in
``GraphRecursionError`` instead of an answer. The search tool is withheld from a model call
once fewer steps are left than one more search and the answer after it need, as the run's
config says (the stop step ``recursion_limit`` gives, and the step LangGraph is at).
"""

from __future__ import annotations

import logging

from langgraph.config import get_config

CONFIG_KEY_SCRATCHPAD = "__pregel_scratchpad"
"""Where LangGraph keeps a task's step and its run's stop step in the config (the key its
``RemainingSteps`` managed value reads; ``langgraph._internal`` names it)."""

log = logging.getLogger(__name__)

STEPS_PER_SEARCH = 4
"""What a search offered to a model call may still take before the answer: the tools node,
what runs before the model again (the keeper, a pre-model hook), the model's answer, and one
node after the model (a post-model hook)."""


def steps_left() -> int | None:
    """The graph steps the running LangGraph run may still take (None: not inside a graph run,
    as in the proxy). It is what LangGraph's own ``RemainingSteps`` reads: the run's stop step
    (its first step plus ``recursion_limit``) less the step it is at, so it counts from where
    this run started on its thread, not from the thread's first step."""
    try:
        config = get_config()
    except RuntimeError:
        return None
    scratchpad = (config.get("configurable") or {}).get(CONFIG_KEY_SCRATCHPAD)
    step, stop = getattr(scratchpad, "step", None), getattr(scratchpad, "stop", None)
    if not isinstance(step, int) or not isinstance(stop, int):
        return None
    return stop - step


def room_for_a_search() -> bool:
    """Whether the running graph has steps left for one more search and the answer after it
    (True outside a graph run)."""
    left = steps_left()
    if left is None or left >= STEPS_PER_SEARCH:
        return True
    log.info("search tool withheld: %d graph steps left before the recursion limit", left)
    return False
