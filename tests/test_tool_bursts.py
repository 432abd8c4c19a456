"""Bursts of tool results: fifty or more parallel results arriving at once.

They used to raise ``WindowTooSmallError`` from the caps (each result was given at least an
excerpt's head, tail and full pointer), and since the results stay in the graph state every
later invoke failed too; the error's parts did not add up to the total it stated. Now each
result takes what the room allows, down to a one-line pointer, the rest readable from the
archive; the only refusal left is input that cannot fit even so, and its numbers add up.
"""

from __future__ import annotations

import re

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from keeper_middleware import Keeper, KeeperConfig, WindowTooSmallError, create_keeper_agent
from keeper_middleware.messages.facts import keeper_kind, text_of
from keeper_middleware.node import KeeperNode
from tests.fake_model import ScriptedChatModel

THREAD = {"configurable": {"thread_id": "t1"}}
READ = re.compile(r'read="([^"]+)"')


def page(url: str, chars: int) -> str:
    lines = [f"{url} line {n}: status ok, latency {n % 17} ms" for n in range(chars // 30 + 1)]
    return "\n".join(lines)[:chars]


def burst_agent(calls: int, chars: int, window: int):
    @tool
    def fetch(url: str) -> str:
        """Fetch a page."""
        return page(url, chars)

    keeper = Keeper(KeeperConfig(window=window))
    reads: list[str] = []

    def reply(messages: list[BaseMessage]):
        if keeper_kind(messages[-1]) in ("notes_request", "notes_reask"):
            return "NO CHANGES"
        last = messages[-1]
        if isinstance(last, HumanMessage) and "fetch" in text_of(last):
            urls = [f"https://site.test/{i}" for i in range(calls)]
            return AIMessage(
                "",
                tool_calls=[
                    {"name": "fetch", "args": {"url": u}, "id": f"call_{i:03d}"}
                    for i, u in enumerate(urls)
                ],
            )
        if isinstance(last, ToolMessage) and last.name == "fetch":
            found = READ.search(text_of(last))
            if found:  # follow one pointer back to the archive
                return AIMessage(
                    "",
                    tool_calls=[
                        {"name": "search_archive", "args": {"read": found.group(1)}, "id": "r1"}
                    ],
                )
            return "All pages fetched."
        if isinstance(last, ToolMessage):
            reads.append(text_of(last))
            return "All pages fetched."
        return "ok"

    model = ScriptedChatModel(default=reply)
    agent = create_keeper_agent(model, [fetch], keeper=keeper, checkpointer=InMemorySaver())
    schemas = KeeperNode(keeper, model=model, tools=[fetch]).setup.tool_schemas
    return agent, keeper, model, reads, schemas


@pytest.mark.parametrize(
    ("calls", "chars", "window"),
    [(50, 2_000, 8_192), (60, 300, 8_192), (120, 6_000, 32_768)],
    ids=["50x2K@8K", "60-small@8K", "120x6K@32K"],
)
def test_a_burst_of_parallel_results_is_handled_and_each_is_readable(calls, chars, window):
    agent, keeper, model, reads, schemas = burst_agent(calls, chars, window)
    agent.invoke({"messages": [HumanMessage("Task: check the sites.")]}, THREAD)
    out = agent.invoke({"messages": [HumanMessage("Item 2. Please fetch every site.")]}, THREAD)
    assert text_of(out["messages"][-1]) == "All pages fetched."
    for _ in range(3):  # the thread goes on: nothing stays wedged
        agent.invoke({"messages": [HumanMessage("Item 3. Anything new?")]}, THREAD)
    for received in model.received:
        size = keeper.tokens.count_messages(received.messages, schemas)
        assert size <= keeper.config.budget, f"a request of {size} tokens went out"
    tools = [t for t in keeper.archive.turns("t1") if t.role == "tool"]
    assert len({t.tool_call_id for t in tools}) == len(tools)  # each result archived once
    whole = {t.tool_call_id: t.content for t in tools}
    for i in range(calls):
        assert whole[f"call_{i:03d}"] == page(f"https://site.test/{i}", chars)
    if reads:  # a pointer read back gives the start of that result
        body = reads[0].split("\n", 1)[1]
        assert body.startswith("https://site.test/")


def test_a_burst_that_cannot_fit_even_as_pointers_is_folded_and_the_thread_goes_on():
    agent, keeper, model, _reads, schemas = burst_agent(50, 100, 4_096)
    agent.invoke({"messages": [HumanMessage("Task: check the sites.")]}, THREAD)
    out = agent.invoke({"messages": [HumanMessage("Item 2. Please fetch every site.")]}, THREAD)
    assert text_of(out["messages"][-1]) == "All pages fetched."
    folded = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert len(folded) == 1 and "50 tool calls at once" in text_of(folded[0])
    for _ in range(3):  # the thread goes on
        agent.invoke({"messages": [HumanMessage("Item 3. Anything new?")]}, THREAD)
    for received in model.received:
        assert keeper.tokens.count_messages(received.messages, schemas) <= keeper.config.budget
    tools = [t for t in keeper.archive.turns("t1") if t.role == "tool"]
    assert len({(t.tool_call_id, t.digest) for t in tools}) == len(tools) == 50
    whole = {t.tool_call_id: t.content for t in tools}
    assert all(whole[f"call_{i:03d}"] == page(f"https://site.test/{i}", 100) for i in range(50))


def test_a_round_that_cannot_fit_even_folded_is_refused_with_numbers_that_add_up(monkeypatch):
    import tests.test_tool_bursts as here

    plain = here.create_keeper_agent
    prompt = "Check every figure twice. " * 230  # room for the task, not for the folded round
    monkeypatch.setattr(
        here, "create_keeper_agent", lambda m, t, **kw: plain(m, t, system_prompt=prompt, **kw)
    )
    agent, keeper, _model, _reads, _schemas = burst_agent(50, 100, 4_096)
    agent.invoke({"messages": [HumanMessage("Task: check the sites.")]}, THREAD)
    with pytest.raises(WindowTooSmallError) as raised:
        agent.invoke({"messages": [HumanMessage("Item 2. Please fetch every site.")]}, THREAD)
    text = str(raised.value)
    listed, total = text.split(" = ")[0], text.split(" = ")[1]
    parts = [int(n) for n in re.findall(r" (\d+)(?= \+|$)", listed)]
    stated = int(re.match(r"(\d+) tokens", total).group(1))
    assert sum(parts) == stated, text
    over = int(re.search(r"by (\d+)\.", text).group(1))
    assert stated - keeper.config.budget == over
    assert "the new round of 50 tool calls folded to one call" in text


def numbers_add_up(text: str, total_pattern: str) -> None:
    """The parts a refusal lists add up to the total it states, and the total minus the budget
    is what it says the request is over by."""
    stated = int(re.search(total_pattern, text).group(1))
    listed = re.search(r"\(([^()]*(?:\([^()]*\)[^()]*)*)\)", text).group(1)
    parts = [int(n) for n in re.findall(r" (-?\d+)(?= \+|$)", listed)]
    assert sum(parts) == stated, text
    budget = int(re.search(r"budget of (\d+)", text).group(1))
    assert stated - budget == int(re.search(r"by (\d+)", text).group(1)), text


def test_a_request_nothing_can_be_cut_from_lists_parts_that_add_up_to_its_size():
    from keeper_middleware import ModelSetup

    keeper = Keeper(KeeperConfig(window=4096, reply_reserve=512))
    messages = [HumanMessage("Task: keep going.", id="h0")]
    first = keeper.step("s", messages, None, ModelSetup(system_prompt="Be brief."), None)
    huge = ModelSetup(system_prompt="Be careful with every figure. " * 600)
    with pytest.raises(WindowTooSmallError) as raised:
        keeper.step("s", first.messages, first.state, huge, None)
    text = str(raised.value)
    assert "system prompt" in text and "nothing more can be cut" in text
    numbers_add_up(text, r"the request is (\d+) tokens")
