"""Fifty parallel archive searches in a small window, through every entry point.

A reply with 50 ``search_archive`` calls in a 4K window raised ``WindowTooSmallError`` on that
step ("the new input at its smallest (51 messages) 4,284 tokens") and, since the results stay
in the graph's state, on every later invoke. Now the searches past the stop line are refused in
a few tokens, and a round too big even at its smallest is folded: every call and result archived
whole, one pointer pair in view that reads the round back page by page.
"""

from __future__ import annotations

import re

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from keeper_middleware import Keeper, KeeperConfig
from keeper_middleware.messages.facts import keeper_kind, text_of
from keeper_middleware.search.guards import SPENT_LINE, STOP_LINE
from keeper_middleware.search.schema import SEARCH_TOOL_NAME
from tests.entry_points import ENTRY_POINTS, build
from tests.fake_model import ScriptedChatModel

pytestmark = pytest.mark.filterwarnings(
    "ignore:create_react_agent has been moved:langgraph.warnings.LangGraphDeprecatedSinceV10"
)
CALLS = 50
READ = re.compile(r'search_archive\(read="([^"]+)", page=1\)')


def story(item: int) -> str:
    return f"Item {item}. Mira set c{item} to {item * 3}. " + "The ledger was checked again. " * 12


class BurstModel:
    """Answers note requests with no changes; asked to search, calls the archive search 50
    times at once (a new query each); after a fold, reads the round back once it may."""

    def __init__(self) -> None:
        self.pages: list[str] = []
        self.pointer: str | None = None

    def __call__(self, messages: list[BaseMessage]) -> AIMessage | str:
        last = messages[-1]
        if keeper_kind(last) in ("notes_request", "notes_reask"):
            return "NO CHANGES"
        for message in messages:
            found = READ.search(text_of(message)) if isinstance(message, ToolMessage) else None
            if found and "tool calls at once" in text_of(message):
                self.pointer = found.group(1)
        if isinstance(last, HumanMessage) and "Please search" in text_of(last):
            calls = [
                {"name": SEARCH_TOOL_NAME, "args": {"query": f"c{i} value"}, "id": f"call_{i:03d}"}
                for i in range(CALLS)
            ]
            return AIMessage("", tool_calls=calls)
        if isinstance(last, HumanMessage) and "read back" in text_of(last) and self.pointer:
            call = {"name": SEARCH_TOOL_NAME, "args": {"read": self.pointer}, "id": "read_1"}
            return AIMessage("", tool_calls=[call])
        if isinstance(last, ToolMessage) and last.tool_call_id == "read_1":
            self.pages.append(text_of(last))
        return "Done."


@pytest.mark.parametrize("window", [4_096, 8_192], ids=["4K", "8K"])
@pytest.mark.parametrize("kind", ENTRY_POINTS)
def test_fifty_parallel_searches_never_wedge_the_thread(kind, window):
    keeper = Keeper(KeeperConfig(window=window, reply_reserve=512))
    script = BurstModel()
    entry = build(kind, ScriptedChatModel(default=script), keeper)
    for item in range(1, 13):
        entry.say(story(item))
    out = entry.say("Item 20. Please search the archive for every counter.")
    assert text_of(out["messages"][-1]) == "Done."
    # two more inputs after the burst: the thread goes on
    out = entry.say("Item 21. Now read back what the searches found.")
    assert text_of(out["messages"][-1]) == "Done."
    out = entry.say(story(22))
    assert text_of(out["messages"][-1]) == "Done."
    entry.within_window()
    turns = list(keeper.turns("t1"))
    humans = [t.content for t in turns if t.role == "human"]
    shown = [text_of(m) for m in out["messages"] if isinstance(m, HumanMessage)]
    for item in range(1, 13):  # nothing lost from the archive, nothing doubled
        assert humans.count(story(item)) + shown.count(story(item)) >= 1
        assert humans.count(story(item)) <= 1
    results = [t for t in turns if t.role == "tool" and t.tool_call_id.startswith("call_")]
    in_view = [
        m
        for m in out["messages"]
        if isinstance(m, ToolMessage) and m.tool_call_id.startswith("call_")
    ]
    # every result is in the archive whole, or still in view
    archived = {t.tool_call_id for t in results}
    assert len(archived) == len(results)
    assert archived | {m.tool_call_id for m in in_view} >= {f"call_{i:03d}" for i in range(CALLS)}
    every = "\n".join([*(t.content for t in results), *(text_of(m) for m in in_view)])
    assert STOP_LINE in every
    assert every.count(SPENT_LINE) >= 30  # past the stop line: a few tokens each
    if script.pointer is not None:  # folded: the round reads back, calls and results
        assert window == 4_096
        assert script.pages and "call_000" in script.pages[0]
        assert "Found" in script.pages[0] or "match" in script.pages[0]


def test_the_searches_past_the_stop_line_cost_a_few_tokens_each():
    keeper = Keeper(KeeperConfig(window=4_096, reply_reserve=512))
    assert keeper.tokens.count_text(SPENT_LINE) <= 12 < keeper.tokens.count_text(STOP_LINE)
