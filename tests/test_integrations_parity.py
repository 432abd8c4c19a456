"""One long scenario through the three ways of adding the keeper: the LangChain middleware
(``create_agent``), the ``pre_model_hook`` (``create_react_agent``) and ``KeeperNode`` in a
hand-built ``StateGraph``. All three must archive the same turns, write the same NOTES, keep the
RULES next to every question, never split a tool call from its result, and never send more than
the window.

The scenario helpers here are shared with the other integration tests.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.tools import BaseTool, tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.prebuilt import ToolNode, create_react_agent, tools_condition
from pydantic import Field

from keeper_middleware import Keeper, KeeperConfig, KeeperGraphState, KeeperNode
from keeper_middleware.integrations.langchain import (
    KeeperMiddleware,
    KeeperReactState,
    keeper_pre_model_hook,
)
from keeper_middleware.messages.facts import keeper_kind, text_of
from keeper_middleware.notes.block import parse_notes
from keeper_middleware.search.tool import archive_search_tool
from tests.fake_model import Received, ScriptedChatModel

SYSTEM = "You are a careful clerk. Use the tools when you need them."
RULE = "Report every amount in words, never in digits."
TASK = f"Task: keep track of the registers as the items arrive. Rule: {RULE}"
CONFIG = KeeperConfig(window=4096, reply_reserve=512)
FILLER = "The shop stayed quiet and the ledger lay open on the counter. " * 6
QUESTION_EVERY = 7
THREAD = "t1"

RECORDED = re.compile(r"recorded (r\d+) at (\d+)")
RULE_IN_TEXT = re.compile(r"Rule: ([^\n]+)")


def amount(item: int) -> int:
    return (item * 37) % 900 + 100


@tool
def lookup(name: str) -> str:
    """Look up which shelf a register is kept on."""
    digits = sum(int(c) for c in name if c.isdigit())
    return f"Register {name} is kept on shelf {digits % 9 + 1}."


TOOLS: list[BaseTool] = [lookup]


def turn_text(turn: int) -> str:
    """Turn ``turn`` of the scenario: an item, or every few turns a question about an old one."""
    if turn % QUESTION_EVERY == 0:
        old = max(1, turn - 40)
        return f"Questions (turn {turn}):\n1. What was r{old} recorded at?"
    return f"Item {turn}. The clerk recorded r{turn} at {amount(turn)}. {FILLER}"


def scenario(turns: int) -> Iterator[str]:
    yield TASK
    for turn in range(1, turns + 1):
        yield turn_text(turn)


# ---------------------------------------------------------------- the scripted clerk


def _call_id(kind: str, text: str) -> str:
    return f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:10]}"


def _note_reply(messages: list[BaseMessage]) -> str:
    """Change lines for the turns after the NOTES (and the kept messages) up to the request."""
    start = 1 if messages and isinstance(messages[0], SystemMessage) else 0
    for index, message in enumerate(messages):
        if keeper_kind(message) == "notes":
            start = index + 1 + parse_notes(text_of(message))[1]
    end = max(i for i, m in enumerate(messages) if keeper_kind(m) == "notes_request")
    lines: list[str] = []
    for message in messages[:end]:
        lines += [f"RULE: {r.strip()}" for r in RULE_IN_TEXT.findall(text_of(message))]
    for message in messages[start:end]:
        if keeper_kind(message) is None:
            lines += [f"SET {k} = {v}" for k, v in RECORDED.findall(text_of(message))]
    return "\n".join(dict.fromkeys(lines)) or "NO CHANGES"


def clerk(messages: list[BaseMessage]) -> AIMessage | str:
    """A deterministic model: looks each register up, searches the archive for old ones."""
    last = messages[-1]
    if keeper_kind(last) in ("notes_request", "notes_reask"):
        return _note_reply(messages)
    mine = [m for m in messages if keeper_kind(m) is None]
    latest = mine[-1]
    if isinstance(latest, ToolMessage):
        if latest.name == "search_archive":
            found = RECORDED.findall(text_of(latest))
            return f"1. {found[0][1]}" if found else "1. I cannot find it."
        return "Noted."
    text = text_of(latest)
    asked = re.search(r"What was (r\d+) recorded", text)
    if asked:
        call = {"name": "search_archive", "args": {"query": asked.group(1)}}
    elif (item := re.search(r"recorded (r\d+)", text)) is not None:
        call = {"name": "lookup", "args": {"name": item.group(1)}}
    else:
        return "Understood."
    call_id = _call_id(call["name"], text)
    return AIMessage(content="", tool_calls=[{**call, "id": call_id, "type": "tool_call"}])


class ClerkModel(ScriptedChatModel):
    """The scripted model without its request log in its repr: ``create_agent`` binds tools on
    every call, and LangChain serialises the bound model (repr included) each time, so a log in
    the repr makes a long run quadratic."""

    received: list[Received] = Field(default_factory=list, repr=False)
    script: list[Any] = Field(default_factory=list, repr=False)


def scripted_model() -> ScriptedChatModel:
    return ClerkModel(default=clerk)


# ---------------------------------------------------------------- the three agents


def middleware_agent(model: Any, keeper: Keeper, checkpointer: Any = None, **extra: Any) -> Any:
    middleware = [
        *extra.pop("before", []),
        KeeperMiddleware(model, tools=TOOLS, system_prompt=SYSTEM, keeper=keeper),
        *extra.pop("after", []),
    ]
    return create_agent(
        model,
        TOOLS,
        system_prompt=SYSTEM,
        middleware=middleware,
        checkpointer=checkpointer or InMemorySaver(),
    )


def react_agent(model: Any, keeper: Keeper, checkpointer: Any = None) -> Any:
    hook = keeper_pre_model_hook(model, tools=TOOLS, system_prompt=SYSTEM, keeper=keeper)
    return create_react_agent(
        model,
        hook.tools,
        prompt=SYSTEM,
        pre_model_hook=hook,
        state_schema=KeeperReactState,
        checkpointer=checkpointer or InMemorySaver(),
    )


def graph_agent(model: Any, keeper: Keeper, checkpointer: Any = None) -> Any:
    node = KeeperNode(keeper, model=model, tools=TOOLS, system_prompt=SYSTEM)
    bound = model.bind_tools(list(node.tools))

    def call_model(state: KeeperGraphState) -> dict[str, Any]:
        return {"messages": [bound.invoke([SystemMessage(SYSTEM), *state["messages"]])]}

    graph = StateGraph(KeeperGraphState)
    graph.add_node("keeper", node.as_runnable())
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode(list(node.tools)))
    graph.add_edge(START, "keeper")
    graph.add_edge("keeper", "model")
    graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "keeper")
    return graph.compile(checkpointer=checkpointer or InMemorySaver())


def thread(name: str = THREAD) -> dict[str, Any]:
    return {"configurable": {"thread_id": name}}


def run(agent: Any, texts: Iterator[str] | list[str], name: str = THREAD) -> None:
    for text in texts:
        agent.invoke({"messages": [HumanMessage(text)]}, thread(name))


# ---------------------------------------------------------------- what is checked


def archive_contents(keeper: Keeper, session: str = THREAD) -> list[tuple[Any, ...]]:
    """The archive without message ids (those are random per run)."""
    return [
        (t.item, t.role, t.content, t.tool_calls_json, t.tool_call_id, t.name)
        for t in keeper.archive.turns(session)
    ]


def notes_texts(keeper: Keeper, session: str = THREAD) -> list[str]:
    return [v.text for v in keeper.archive.notes_versions(session)]


@functools.cache
def _schema(name: str) -> dict[str, Any]:
    by_name = {t.name: t for t in [*TOOLS, archive_search_tool(Keeper(CONFIG))]}
    return convert_to_openai_tool(by_name[name])


def tool_schemas(names: list[str]) -> list[dict[str, Any]]:
    return [_schema(n) for n in names]


def is_question(message: BaseMessage) -> bool:
    return (
        isinstance(message, HumanMessage)
        and keeper_kind(message) is None
        and (text_of(message).startswith("Questions"))
    )


@dataclass
class Findings:
    requests: int = 0
    largest: int = 0
    questions_seen: int = 0
    problems: list[str] = field(default_factory=list)


def inspect(model: ScriptedChatModel, keeper: Keeper) -> Findings:
    """Every request the model received, checked against the keeper's promises."""
    found = Findings()
    notes_seen = False
    for index, received in enumerate(model.received):
        messages = received.messages
        found.requests += 1
        size = keeper.tokens.count_messages(messages, tool_schemas(received.tools))
        found.largest = max(found.largest, size)
        if size > CONFIG.budget:
            found.problems.append(f"request {index}: {size} tokens > {CONFIG.budget}")
        if not (isinstance(messages[0], SystemMessage) and messages[0].content == SYSTEM):
            found.problems.append(f"request {index}: system prompt missing")
        if sorted(received.tools) != ["lookup", "search_archive"]:
            found.problems.append(f"request {index}: tools {received.tools}")
        called: set[str] = set()
        for position, message in enumerate(messages):
            if isinstance(message, AIMessage):
                called |= {c["id"] for c in message.tool_calls if c.get("id")}
                answered = {
                    m.tool_call_id for m in messages[position + 1 :] if isinstance(m, ToolMessage)
                }
                if any(c["id"] not in answered for c in message.tool_calls):
                    found.problems.append(f"request {index}: a tool call lost its result")
            if isinstance(message, ToolMessage) and message.tool_call_id not in called:
                found.problems.append(f"request {index}: a tool result without its call")
            notes_seen = notes_seen or keeper_kind(message) == "notes"
            if is_question(message) and notes_seen:
                found.questions_seen += 1
                after = messages[position + 1] if position + 1 < len(messages) else None
                if after is None or keeper_kind(after) != "rules" or RULE not in text_of(after):
                    found.problems.append(f"request {index}: no RULES right after a question")
    return found


# ---------------------------------------------------------------- the tests

WAYS: dict[str, Callable[..., Any]] = {
    "middleware": middleware_agent,
    "react_hook": react_agent,
    "custom_graph": graph_agent,
}
TURNS = 160


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[ScriptedChatModel, Keeper]]:
    import warnings

    from langgraph.warnings import LangGraphDeprecatedSinceV10

    done: dict[str, tuple[ScriptedChatModel, Keeper]] = {}
    for name, build in WAYS.items():
        model, keeper = scripted_model(), Keeper(CONFIG)
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", "create_react_agent has been moved", LangGraphDeprecatedSinceV10
            )
            agent = build(model, keeper)
        run(agent, scenario(TURNS))
        done[name] = (model, keeper)
    return done


def test_the_scenario_makes_many_cuts_and_finds_archived_facts_by_searching(runs):
    _, keeper = runs["middleware"]
    counters = keeper.counters(THREAD)
    assert counters.cuts >= 10
    assert counters.searches >= TURNS // QUESTION_EVERY - 1
    answers = {t.content for t in keeper.archive.turns(THREAD) if t.role == "ai"}
    asked = [max(1, turn - 40) for turn in range(QUESTION_EVERY, TURNS, QUESTION_EVERY)]
    right = [old for old in asked if f"1. {amount(old)}" in answers]
    assert len(right) >= len(asked) - 2


@pytest.mark.parametrize("way", list(WAYS))
def test_every_request_keeps_the_promises(runs, way):
    model, keeper = runs[way]
    found = inspect(model, keeper)
    assert found.problems == []
    assert found.questions_seen >= TURNS // QUESTION_EVERY - 3
    assert found.largest <= CONFIG.budget


@pytest.mark.parametrize("way", ["react_hook", "custom_graph"])
def test_all_three_ways_archive_the_same_turns_and_write_the_same_notes(runs, way):
    _, reference = runs["middleware"]
    _, keeper = runs[way]
    assert archive_contents(keeper) == archive_contents(reference)
    assert notes_texts(keeper) == notes_texts(reference)
    assert RULE in keeper.notes(THREAD).rules[0]


@pytest.mark.parametrize("way", list(WAYS))
def test_note_calls_render_like_work_calls(runs, way):
    model, _ = runs[way]
    notes = [r for r in model.received if keeper_kind(r.messages[-1]) == "notes_request"]
    work = [r for r in model.received if keeper_kind(r.messages[-1]) != "notes_request"]
    assert notes and work
    assert {(r.messages[0].content, tuple(r.tools)) for r in notes} == {
        (work[0].messages[0].content, tuple(work[0].tools))
    }


def test_the_inspection_catches_each_broken_promise():
    keeper, model = Keeper(CONFIG), scripted_model()
    call = {"name": "lookup", "args": {"name": "r1"}, "id": "c1", "type": "tool_call"}
    notes = HumanMessage("[NOTES] ...", additional_kwargs={"keeper": "notes"})
    question = HumanMessage("Questions (turn 7):\n1. What was r1 recorded at?")
    broken = [
        [SystemMessage(SYSTEM), notes, ToolMessage("shelf 1", tool_call_id="c1")],
        [SystemMessage(SYSTEM), AIMessage("", tool_calls=[call])],
        [SystemMessage(SYSTEM), notes, question],
        [SystemMessage(SYSTEM), HumanMessage("x" * 4 * CONFIG.budget)],
        [HumanMessage("no system prompt")],
    ]
    model.received.extend(Received(m, ["lookup", "search_archive"]) for m in broken)
    assert len(inspect(model, keeper).problems) == len(broken)
