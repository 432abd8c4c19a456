"""After the stop line, the next model call is not offered ``search_archive``, in every entry
point: ``create_keeper_agent`` (the LangGraph node), a hand-built graph, ``KeeperMiddleware``,
the react hook and the proxy. A model that never stops searching ends with an answer.

Such a model (the same query each time, or a new one) used to be refused and stopped in words
only, and searched on until LangGraph's recursion limit ended the run with
``GraphRecursionError``. The tool is offered again when new input arrives.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.errors import GraphRecursionError
from langgraph.graph import END, START, StateGraph
from langgraph.prebuilt import ToolNode, create_react_agent, tools_condition

from keeper_middleware import (
    Keeper,
    KeeperConfig,
    KeeperGraphState,
    KeeperNode,
    create_keeper_agent,
)
from keeper_middleware.integrations.langchain import (
    KeeperMiddleware,
    KeeperReactState,
    keeper_pre_model_hook,
)
from keeper_middleware.messages.facts import keeper_kind, text_of
from keeper_middleware.search.guards import STOP_LINE, GuardState, SearchCommand, decide
from keeper_middleware.search.schema import SEARCH_TOOL_NAME
from tests.fake_model import ScriptedChatModel
from tests.proxy_upstream import ScriptedUpstream, chat, client_for, convo, make_app, tool_reply

pytestmark = pytest.mark.filterwarnings(
    "ignore:create_react_agent has been moved:langgraph.warnings.LangGraphDeprecatedSinceV10"
)
THREAD = {"configurable": {"thread_id": "t1"}}
CONFIG = KeeperConfig(window=8192, search_budget=4)


class NeverStops:
    """A model that answers every work call with one more search (and a line of text), and
    note requests with no changes."""

    def __init__(self, *, same_query: bool = False, text: str = "Let me look once more.") -> None:
        self.same_query, self.text, self.calls = same_query, text, 0

    def __call__(self, messages: list[BaseMessage]) -> AIMessage | str:
        if keeper_kind(messages[-1]) in ("notes_request", "notes_reask"):
            return "NO CHANGES"
        self.calls += 1
        query = "where is it" if self.same_query else f"where is it {self.calls}"
        call = {"name": SEARCH_TOOL_NAME, "args": {"query": query}, "id": f"s{self.calls}"}
        return AIMessage(self.text, tool_calls=[call])


def offered(model: ScriptedChatModel) -> list[bool]:
    """For each work call, whether it was offered the search tool."""
    notes = ("notes_request", "notes_reask")
    return [
        SEARCH_TOOL_NAME in r.tools
        for r in model.received
        if keeper_kind(r.messages[-1]) not in notes
    ]


def test_the_stop_line_withholds_the_tool_until_new_input():
    state, stopped = GuardState(), None
    for n in range(6):
        decision = decide(state, SearchCommand(query=f"q{n}"), budget=3)
        state = decision.state
        if decision.verdict == "stop":
            stopped = n
            break
    assert stopped == 3 and STOP_LINE in decision.message and state.withheld
    assert GuardState.from_json(state.to_json()).withheld
    from keeper_middleware.search.guards import after_new_input

    assert not after_new_input(state).withheld


@pytest.mark.parametrize("same_query", [False, True], ids=["new-query", "same-query"])
def test_create_keeper_agent_ends_a_search_loop_with_an_answer(same_query):
    keeper = Keeper(CONFIG)
    model = ScriptedChatModel(default=NeverStops(same_query=same_query))
    agent = create_keeper_agent(model, keeper=keeper, checkpointer=InMemorySaver())
    out = agent.invoke({"messages": [HumanMessage("Question: where is the key?")]}, THREAD)
    last = out["messages"][-1]
    assert isinstance(last, AIMessage) and not last.tool_calls
    assert text_of(last) == "Let me look once more."
    seen = offered(model)
    assert seen[-1] is False and all(seen[:-1])  # only the call after the stop line lost it
    assert keeper.counters("t1").search_stops == 1
    # new input: the tool is offered again
    agent.invoke({"messages": [HumanMessage("Item 2. A new file arrived.")]}, THREAD)
    assert offered(model)[len(seen)] is True


def test_a_model_that_sends_only_searches_still_ends_the_run():
    keeper = Keeper(CONFIG)
    model = ScriptedChatModel(default=NeverStops(text=""))
    agent = create_keeper_agent(model, keeper=keeper, checkpointer=InMemorySaver())
    out = agent.invoke({"messages": [HumanMessage("Question: where is the key?")]}, THREAD)
    assert not out["messages"][-1].tool_calls


def test_a_hand_built_graph_ends_a_search_loop_async():
    keeper = Keeper(CONFIG)
    model = ScriptedChatModel(default=NeverStops())
    node = KeeperNode(keeper, model=model)
    graph = StateGraph(KeeperGraphState)
    graph.add_node("keeper", node.as_runnable())
    graph.add_node("model", node.model_runnable())
    graph.add_node("tools", ToolNode([t for t in node.tools if not isinstance(t, dict)]))
    graph.add_edge(START, "keeper")
    graph.add_edge("keeper", "model")
    graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "keeper")
    agent = graph.compile(checkpointer=InMemorySaver())
    out = asyncio.run(
        agent.ainvoke({"messages": [HumanMessage("Question: where is the key?")]}, THREAD)
    )
    assert not out["messages"][-1].tool_calls
    assert offered(model)[-1] is False


@pytest.mark.parametrize("run", ["sync", "async"])
def test_the_middleware_ends_a_search_loop_with_an_answer(run):
    keeper = Keeper(CONFIG)
    model = ScriptedChatModel(default=NeverStops())
    middleware = KeeperMiddleware(model, keeper=keeper)
    agent = create_agent(model, middleware=[middleware], checkpointer=InMemorySaver())
    sent = {"messages": [HumanMessage("Question: where is the key?")]}
    out = asyncio.run(agent.ainvoke(sent, THREAD)) if run == "async" else agent.invoke(sent, THREAD)
    assert text_of(out["messages"][-1]) == "Let me look once more."
    assert not out["messages"][-1].tool_calls
    assert offered(model)[-1] is False


def test_the_react_hook_model_ends_a_search_loop_with_an_answer():
    keeper = Keeper(CONFIG)
    model = ScriptedChatModel(default=NeverStops())
    hook = keeper_pre_model_hook(model, keeper=keeper)
    agent = create_react_agent(
        hook.model,
        hook.tools,
        pre_model_hook=hook,
        state_schema=KeeperReactState,
        checkpointer=InMemorySaver(),
    )
    out = agent.invoke({"messages": [HumanMessage("Question: where is the key?")]}, THREAD)
    assert text_of(out["messages"][-1]) == "Let me look once more."
    assert offered(model)[-1] is False


@pytest.mark.parametrize("run", ["sync", "async"])
def test_the_react_hook_with_the_agents_own_model_ends_a_search_loop_after_the_model(run):
    # create_react_agent binds a model of its own to every tool at every call: the tool cannot
    # be withheld, so the post-model hook drops the search calls made after the stop line
    keeper = Keeper(CONFIG)
    model = ScriptedChatModel(default=NeverStops())
    hook = keeper_pre_model_hook(model, keeper=keeper)
    agent = create_react_agent(
        model,
        hook.tools,
        pre_model_hook=hook,
        post_model_hook=hook.after_model,
        state_schema=KeeperReactState,
        checkpointer=InMemorySaver(),
    )

    def send(text: str) -> dict[str, Any]:
        sent = {"messages": [HumanMessage(text)]}
        if run == "async":
            return asyncio.run(agent.ainvoke(sent, THREAD))
        return agent.invoke(sent, THREAD)

    out = send("Question: where is the key?")
    last = out["messages"][-1]
    assert isinstance(last, AIMessage) and not last.tool_calls
    assert text_of(last) == "Let me look once more."
    assert sum(isinstance(m, AIMessage) and m is not last for m in out["messages"]) == (
        CONFIG.search_budget + 1
    )
    assert keeper.counters("t1").search_stops == 1
    # new input: searching works again, and the loop ends the same way
    out = send("Item 2. A new file arrived.")
    assert not out["messages"][-1].tool_calls and keeper.counters("t1").search_stops == 2


def test_the_react_hook_warns_when_the_agent_can_offer_the_tool_after_the_stop_line(caplog):
    keeper = Keeper(CONFIG)
    model = ScriptedChatModel(default=NeverStops())
    hook = keeper_pre_model_hook(model, keeper=keeper)
    agent = create_react_agent(
        model,
        hook.tools,
        pre_model_hook=hook,
        state_schema=KeeperReactState,
        checkpointer=InMemorySaver(),
    )
    with caplog.at_level("WARNING"), pytest.raises(GraphRecursionError):
        agent.invoke(
            {"messages": [HumanMessage("Question: where is the key?")]},
            {**THREAD, "recursion_limit": 40},
        )
    (warning,) = [r for r in caplog.records if "stop line" in r.getMessage()]
    assert "hook.model" in warning.getMessage() and "hook.after_model" in warning.getMessage()


@pytest.mark.anyio
async def test_the_proxy_withholds_the_tool_after_the_stop_line(tmp_path):
    calls = {"n": 0}

    def never_stops(body: dict[str, Any]) -> Any:
        calls["n"] += 1
        return tool_reply(
            (f"s{calls['n']}", SEARCH_TOOL_NAME, {"query": f"where {calls['n']}"}),
            text="Let me look once more.",
        )

    upstream = ScriptedUpstream(default=never_stops)
    app = make_app(upstream, tmp_path, window=8192, config=CONFIG)
    async with client_for(app) as client:
        response = await client.post(
            "/v1/chat/completions", json=chat(convo("Question: where is the key?"))
        )
    assert response.status_code == 200, response.text
    message = response.json()["choices"][0]["message"]
    assert message["content"] == "Let me look once more." and not message.get("tool_calls")
    names = [
        [t["function"]["name"] for t in body.get("tools") or []] for body in upstream.work_calls
    ]
    assert SEARCH_TOOL_NAME in names[0] and SEARCH_TOOL_NAME not in names[-1]
    assert len(upstream.work_calls) == CONFIG.search_budget + 2  # not the proxy's call limit
    assert json.dumps(upstream.work_calls[-1]).count("Stop searching now") >= 1
    await app.state.proxy.aclose()
