"""The keeper in a hand-built LangGraph agent: a ``KeeperNode`` before the model node.

Your graph keeps its own model node; the keeper node runs before every model call (after the
start and after the tools), and the model binds ``node.tools`` (yours plus the archive search
tool). ``node.model_runnable()`` can replace your model node to also get the keeper's thinking
settings and the stripping of reasoning from stored replies.

    python examples/custom_graph.py
"""

from __future__ import annotations

from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage, SystemMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from middleware_agent import SYSTEM, conversation, default_model, lookup

from keeper_middleware import Keeper, KeeperConfig, KeeperGraphState, KeeperNode
from keeper_middleware.messages.facts import text_of


def build_agent(model: BaseChatModel, keeper: Keeper) -> Any:
    node = KeeperNode(keeper, model=model, tools=[lookup], system_prompt=SYSTEM)
    bound = model.bind_tools(list(node.tools))

    def call_model(state: KeeperGraphState) -> dict[str, Any]:
        return {"messages": [bound.invoke([SystemMessage(SYSTEM), *state["messages"]])]}

    graph = StateGraph(KeeperGraphState)
    graph.add_node("keeper", node.as_runnable())  # the keeper's node
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode(list(node.tools)))
    graph.add_edge(START, "keeper")  # was START -> model
    graph.add_edge("keeper", "model")
    graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "keeper")  # was tools -> model
    return graph.compile(checkpointer=InMemorySaver())


def main(model: BaseChatModel | None = None, items: int = 40) -> Keeper:
    keeper = Keeper(KeeperConfig(window=4096, reply_reserve=512))
    agent = build_agent(model or default_model(), keeper)
    config = {"configurable": {"thread_id": "example"}}
    for text in conversation(items):
        reply = agent.invoke({"messages": [HumanMessage(text)]}, config)["messages"][-1]
        if text.startswith("Questions"):
            print(f"{text.splitlines()[1]} -> {text_of(reply)}")
    counters = keeper.counters("example")
    print(f"cuts: {counters.cuts}, archived turns: {counters.archive_turns}")
    return keeper


if __name__ == "__main__":
    main()
