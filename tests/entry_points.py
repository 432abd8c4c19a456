"""One scripted model behind every graph entry point: ``create_keeper_agent``, ``KeeperMiddleware``
in ``create_agent``, ``keeper_pre_model_hook`` in ``create_react_agent``, and a ``KeeperNode`` in a
hand-built ``StateGraph`` with its model node; for the tests that hold a defect fixed on each."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import HumanMessage
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver

from keeper_middleware import Keeper, KeeperGraphState, KeeperNode, create_keeper_agent
from tests.fake_model import ScriptedChatModel

ENTRY_POINTS = ("agent", "middleware", "hook", "node")


@dataclass
class Entry:
    """A graph built around one keeper and one scripted model, and the tools its model sees."""

    kind: str
    graph: Any
    keeper: Keeper
    model: ScriptedChatModel
    schemas: list[dict[str, Any]]

    def say(self, text: str, thread: str = "t1", **config: Any) -> dict[str, Any]:
        run = {"configurable": {"thread_id": thread}, **config}
        result: dict[str, Any] = self.graph.invoke({"messages": [HumanMessage(text)]}, run)
        return result

    def within_window(self) -> None:
        """Every request the model received was within the keeper's budget."""
        for received in self.model.received:
            size = self.keeper.tokens.count_messages(received.messages, self.schemas)
            assert size <= self.keeper.config.budget, f"a request of {size} tokens went out"


def build(
    kind: str,
    model: ScriptedChatModel,
    keeper: Keeper,
    tools: Sequence[BaseTool] = (),
    *,
    system_prompt: str | None = None,
    checkpointer: Any = None,
) -> Entry:
    saver = checkpointer if checkpointer is not None else InMemorySaver()
    tools = list(tools)
    if kind == "agent":
        graph = create_keeper_agent(
            model, tools, system_prompt=system_prompt, keeper=keeper, checkpointer=saver
        )
        node = KeeperNode(keeper, model=model, tools=tools, system_prompt=system_prompt)
        return Entry(kind, graph, keeper, model, node.setup.tool_schemas)
    if kind == "middleware":
        from langchain.agents import create_agent

        from keeper_middleware.integrations.langchain import KeeperMiddleware

        middleware = KeeperMiddleware(
            model, tools=tools, system_prompt=system_prompt, keeper=keeper
        )
        graph = create_agent(
            model,
            tools,
            system_prompt=system_prompt,
            middleware=[middleware],
            checkpointer=saver,
        )
        return Entry(kind, graph, keeper, model, middleware.setup.tool_schemas)
    if kind == "hook":
        from langgraph.prebuilt import create_react_agent

        from keeper_middleware.integrations.langchain import KeeperReactState, keeper_pre_model_hook

        hook = keeper_pre_model_hook(model, tools=tools, system_prompt=system_prompt, keeper=keeper)
        graph = create_react_agent(
            hook.model,
            hook.tools,
            prompt=system_prompt,
            pre_model_hook=hook,
            state_schema=KeeperReactState,
            checkpointer=saver,
        )
        schemas = [convert_to_openai_tool(t) for t in hook.tools]
        return Entry(kind, graph, keeper, model, schemas)
    if kind == "node":
        from langgraph.graph import END, START, StateGraph
        from langgraph.prebuilt import ToolNode, tools_condition

        node = KeeperNode(keeper, model=model, tools=tools, system_prompt=system_prompt)
        graph = StateGraph(KeeperGraphState)
        graph.add_node("keeper", node.as_runnable())
        graph.add_node("model", node.model_runnable())
        graph.add_node("tools", ToolNode([t for t in node.tools if not isinstance(t, dict)]))
        graph.add_edge(START, "keeper")
        graph.add_edge("keeper", "model")
        graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
        graph.add_edge("tools", "keeper")
        compiled = graph.compile(checkpointer=saver)
        return Entry(kind, compiled, keeper, model, node.setup.tool_schemas)
    raise ValueError(kind)
