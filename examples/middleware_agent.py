"""The keeper in a LangChain ``create_agent`` agent: one line, ``middleware=[KeeperMiddleware(...)]``.

Run it offline (a scripted stand-in model plays the agent):

    python examples/middleware_agent.py

or against any OpenAI-compatible server:

    KEEPER_BASE_URL=http://127.0.0.1:8080/v1 KEEPER_MODEL=qwen3 python examples/middleware_agent.py
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Sequence
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from keeper_middleware import Keeper, KeeperConfig
from keeper_middleware.integrations.langchain import KeeperMiddleware
from keeper_middleware.messages.facts import keeper_kind, text_of

SYSTEM = "You are a careful clerk. Use the tools when you need them."
TASK = "Task: keep track of the registers. Rule: Report every amount in words, never in digits."


@tool
def lookup(name: str) -> str:
    """Look up which shelf a register is kept on."""
    return f"Register {name} is kept on shelf {len(name)}."


def build_agent(model: BaseChatModel, keeper: Keeper) -> Any:
    tools = [lookup]
    return create_agent(
        model,
        tools,
        system_prompt=SYSTEM,
        middleware=[KeeperMiddleware(model, tools=tools, system_prompt=SYSTEM, keeper=keeper)],
        checkpointer=InMemorySaver(),
    )


def conversation(items: int) -> list[str]:
    texts = [TASK]
    for item in range(1, items + 1):
        texts.append(
            f"Item {item}. The clerk recorded r{item} at {item * 7}. " + "It rained. " * 30
        )
        if item % 10 == 0:
            texts.append(f"Questions:\n1. What was r{item - 9} recorded at?")
    return texts


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
    notes = keeper.notes("example")
    print(f"rules kept: {list(notes.rules)}, values noted: {len(notes.state)}")
    return keeper


# ---- everything below only makes the examples run without a model server (the other two
# examples import it from here)


def default_model() -> BaseChatModel:
    if os.environ.get("KEEPER_BASE_URL"):
        from langchain_openai import ChatOpenAI

        return ChatOpenAI(
            base_url=os.environ["KEEPER_BASE_URL"],
            model=os.environ.get("KEEPER_MODEL", "default"),
            api_key=os.environ.get("OPENAI_API_KEY", "none"),  # type: ignore[arg-type]
        )
    return ScriptedClerk()


class ScriptedClerk(BaseChatModel):
    """A stand-in model that plays the agent from a script (``scripted_clerk``)."""

    @property
    def _llm_type(self) -> str:
        return "scripted-clerk"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Runnable[Any, BaseMessage]:
        return self.bind(**kwargs)

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        reply = scripted_clerk(messages)
        message = AIMessage(reply) if isinstance(reply, str) else reply
        return ChatResult(generations=[ChatGeneration(message=message)])


def scripted_clerk(messages: list[BaseMessage]) -> AIMessage | str:
    """Plays the agent: notes what was recorded, looks registers up, searches for old ones."""
    last = messages[-1]
    if keeper_kind(last) in ("notes_request", "notes_reask"):
        sets = re.findall(r"recorded (r\d+) at (\d+)", "\n".join(text_of(m) for m in messages))
        lines = ["RULE: Report every amount in words, never in digits."]
        return "\n".join([*lines, *(f"SET {k} = {v}" for k, v in dict(sets).items())])
    latest = [m for m in messages if keeper_kind(m) is None][-1]
    if isinstance(latest, ToolMessage):
        found = re.findall(r"recorded r\d+ at (\d+)", text_of(latest))
        return f"1. {found[0]}" if found else "Noted."
    asked = re.search(r"What was (r\d+)", text_of(latest))
    item = re.search(r"recorded (r\d+)", text_of(latest))
    if asked:
        call = {"name": "search_archive", "args": {"query": asked.group(1)}}
    elif item:
        call = {"name": "lookup", "args": {"name": item.group(1)}}
    else:
        return "Understood."
    call_id = f"call-{zlib.crc32(text_of(latest).encode())}"
    return AIMessage("", tool_calls=[{**call, "id": call_id, "type": "tool_call"}])


if __name__ == "__main__":
    main()
