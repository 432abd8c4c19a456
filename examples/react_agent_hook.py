"""The keeper in a LangGraph ``create_react_agent`` agent, as its ``pre_model_hook``.

``create_react_agent`` is deprecated in LangGraph v1 (it warns when called) but still used; new
agents should use ``create_agent`` with ``KeeperMiddleware`` (examples/middleware_agent.py).
The change: make the hook, give the agent ``hook.model`` (your model bound to ``hook.tools``,
yours plus the archive search tool, which it withholds after the search tool's stop line) and a
state with room for the keeper's bookkeeping.

    python examples/react_agent_hook.py
"""

from __future__ import annotations

from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt import create_react_agent
from middleware_agent import SYSTEM, conversation, default_model, lookup

from keeper_middleware import Keeper, KeeperConfig
from keeper_middleware.integrations.langchain import KeeperReactState, keeper_pre_model_hook
from keeper_middleware.messages.facts import text_of


def build_agent(model: BaseChatModel, keeper: Keeper) -> Any:
    hook = keeper_pre_model_hook(model, tools=[lookup], system_prompt=SYSTEM, keeper=keeper)
    return create_react_agent(
        hook.model,
        hook.tools,
        prompt=SYSTEM,
        pre_model_hook=hook,
        state_schema=KeeperReactState,
        checkpointer=InMemorySaver(),
    )


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
