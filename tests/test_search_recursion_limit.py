"""A model that never stops searching ends with an answer at any recursion limit, through every
entry point.

With a new query each time, ten searches and the stop line took 35 graph steps, so a run with
``recursion_limit`` 25 to 34 (LangGraph's default for years, and common in user code) ended in
``GraphRecursionError``; and the reply after the stop line, its search calls dropped, was empty.
Now the search tool is withheld once the run has too few steps left for one more search and the
answer after it, and a reply left with nothing to say says so.
"""

from __future__ import annotations

import itertools

import pytest
from langchain_core.messages import AIMessage, BaseMessage

from keeper_middleware import Keeper, KeeperConfig
from keeper_middleware.messages.facts import keeper_kind, text_of
from keeper_middleware.search.guards import NO_ANSWER
from keeper_middleware.search.schema import SEARCH_TOOL_NAME
from tests.entry_points import ENTRY_POINTS, build
from tests.fake_model import ScriptedChatModel

pytestmark = pytest.mark.filterwarnings(
    "ignore:create_react_agent has been moved:langgraph.warnings.LangGraphDeprecatedSinceV10"
)
LIMITS = (25, 26, 27, 34, None)
ANSWER = "From what I found: c1 is 3."


def searcher(queries: str, *, answers: bool) -> ScriptedChatModel:
    """A model that searches at every call (the same query, or a new one each time); with
    ``answers``, it answers in text when the search tool is not offered."""
    count = itertools.count()
    model: ScriptedChatModel

    def reply(messages: list[BaseMessage]) -> AIMessage | str:
        if keeper_kind(messages[-1]) in ("notes_request", "notes_reask"):
            return "NO CHANGES"
        if answers and SEARCH_TOOL_NAME not in model.received[-1].tools:
            return ANSWER
        n = next(count)
        query = "the ledger" if queries == "same" else f"ledger entry {n}"
        call = {"name": SEARCH_TOOL_NAME, "args": {"query": query}, "id": f"s{n}"}
        return AIMessage("", tool_calls=[call])

    model = ScriptedChatModel(default=reply)
    return model


def run(kind: str, queries: str, limit: int | None, *, answers: bool) -> str:
    entry = build(kind, searcher(queries, answers=answers), Keeper(KeeperConfig(window=8192)))
    entry.say("Item 1. Mira set c1 to 3.")
    config = {} if limit is None else {"recursion_limit": limit}
    out = entry.say("Item 2. What is c1?", **config)
    return text_of(out["messages"][-1])


@pytest.mark.parametrize("limit", LIMITS, ids=lambda v: f"limit={v}")
@pytest.mark.parametrize("queries", ["same", "new"])
@pytest.mark.parametrize("kind", ["agent", "middleware"])
def test_a_search_loop_ends_with_an_answer_at_any_recursion_limit(kind, queries, limit):
    assert run(kind, queries, limit, answers=True) == ANSWER
    # a model that asks to search even when it is not offered the tool: still an answer
    assert run(kind, queries, limit, answers=False) == NO_ANSWER


@pytest.mark.parametrize("limit", [25, 27, None], ids=lambda v: f"limit={v}")
@pytest.mark.parametrize("kind", [k for k in ENTRY_POINTS if k not in ("agent", "middleware")])
def test_a_search_loop_ends_with_an_answer_in_the_other_entry_points(kind, limit):
    assert run(kind, "new", limit, answers=True) == ANSWER
    assert run(kind, "same", limit, answers=False) == NO_ANSWER


@pytest.mark.parametrize("limit", [12, 18, 24])
def test_a_search_loop_ends_with_an_answer_at_lower_limits_too(limit):
    assert run("agent", "new", limit, answers=True) == ANSWER
