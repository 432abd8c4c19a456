"""The keeper inside a Deep Agent: ``create_deep_agent(..., middleware=[KeeperMiddleware(...)])``.

Deep Agents brings its own context management: a ``SummarizationMiddleware`` that writes what it
evicts to a file and summarises the rest once the history reaches 85% of the model's window.
With the keeper beside it, only one of them should manage the history: the keeper's
``before_model`` runs first and keeps the history small, so Deep Agents' summariser would never
fire, and switching it off says so (a harness profile for the model's provider with
``excluded_middleware={"SummarizationMiddleware"}``, as Deep Agents documents). Everything else
of the harness (its file tools, to-dos, sub-agents) stays.

Run it offline (a scripted stand-in model plays the agent):

    python examples/deep_agent.py

or against any OpenAI-compatible server:

    KEEPER_BASE_URL=http://127.0.0.1:8080/v1 KEEPER_MODEL=qwen3 python examples/deep_agent.py
"""

from __future__ import annotations

from typing import Any

from deepagents import HarnessProfile, create_deep_agent, register_harness_profile
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from middleware_agent import SYSTEM, conversation, default_model, lookup

from keeper_middleware import Keeper, KeeperConfig
from keeper_middleware.integrations.langchain import KeeperMiddleware
from keeper_middleware.messages.facts import text_of


def without_deep_agents_summaries(model: BaseChatModel) -> None:
    """Register a harness profile for ``model``'s provider that leaves out Deep Agents' own
    summarisation (the keeper manages the history)."""
    provider = model._get_ls_params().get("ls_provider") or type(model).__name__.lower()
    register_harness_profile(
        provider, HarnessProfile(excluded_middleware=frozenset({"SummarizationMiddleware"}))
    )


def build_agent(model: BaseChatModel, keeper: Keeper) -> Any:
    tools = [lookup]
    without_deep_agents_summaries(model)
    return create_deep_agent(
        model,
        tools,
        system_prompt=SYSTEM,
        middleware=[KeeperMiddleware(model, tools=tools, system_prompt=SYSTEM, keeper=keeper)],
        checkpointer=InMemorySaver(),
    )


def main(model: BaseChatModel | None = None, items: int = 40) -> Keeper:
    keeper = Keeper(KeeperConfig(window=8192, reply_reserve=512))
    agent = build_agent(model or default_model(), keeper)
    config = {"configurable": {"thread_id": "example"}}
    for text in conversation(items):
        reply = agent.invoke({"messages": [HumanMessage(text)]}, config)["messages"][-1]
        if text.startswith("Questions"):
            print(f"{text.splitlines()[1]} -> {text_of(reply)}")
    counters = keeper.counters("example")
    print(f"cuts: {counters.cuts}, archived turns: {counters.archive_turns}")
    notes = keeper.notes("example")
    print(f"rules kept: {list(notes.rules)}, values noted: {len(notes.state)}")
    return keeper


if __name__ == "__main__":
    main()
