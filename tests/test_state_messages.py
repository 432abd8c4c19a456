"""Where the keeper's messages live: out of what a chat UI streams by default, in what the model
is sent; the state that keeps every message; and the option that writes them into the state.

Every entry point at its defaults (``create_keeper_agent``, ``KeeperMiddleware`` in
``create_agent``, the pre-model hook given ``hook.model``, a ``KeeperNode`` with its
``model_runnable``) streams ``stream_mode="messages"`` (sync, async, with subgraphs) without a
keeper message, while the model is sent exactly the requests the state-writing option sends it:
the NOTES, the RULES beside each question, the note calls rendered like work calls."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.prebuilt import ToolNode, create_react_agent, tools_condition
from langgraph.warnings import LangGraphDeprecatedSinceV10

from keeper_middleware import Keeper, KeeperConfig, KeeperGraphState, KeeperNode
from keeper_middleware import create_keeper_agent as make_agent
from keeper_middleware.errors import ConfigurationError
from keeper_middleware.integrations.langchain import (
    KeeperMiddleware,
    KeeperReactState,
    keeper_pre_model_hook,
)
from keeper_middleware.messages.facts import is_keeper_message, keeper_kind
from keeper_middleware.state_view import model_view
from tests.fake_model import ScriptedChatModel
from tests.test_integrations_parity import (
    CONFIG,
    SYSTEM,
    THREAD,
    TOOLS,
    inspect,
    scenario,
    scripted_model,
    thread,
)

TURNS = 24
WITH_KEEPER = replace(CONFIG, state_messages="window_with_keeper")
ALL = replace(CONFIG, state_messages="all")


def keeper_agent(model: ScriptedChatModel, keeper: Keeper) -> Any:
    return make_agent(
        model, TOOLS, system_prompt=SYSTEM, keeper=keeper, checkpointer=InMemorySaver()
    )


def middleware_agent(model: ScriptedChatModel, keeper: Keeper) -> Any:
    middleware = KeeperMiddleware(model, tools=TOOLS, system_prompt=SYSTEM, keeper=keeper)
    return create_agent(
        model, TOOLS, system_prompt=SYSTEM, middleware=[middleware], checkpointer=InMemorySaver()
    )


def hook_agent(model: ScriptedChatModel, keeper: Keeper) -> Any:
    """``create_react_agent`` as the hook's docstring wires it: given ``hook.model``."""
    hook = keeper_pre_model_hook(model, tools=TOOLS, system_prompt=SYSTEM, keeper=keeper)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LangGraphDeprecatedSinceV10)
        return create_react_agent(
            hook.model,
            hook.tools,
            prompt=SYSTEM,
            pre_model_hook=hook,
            state_schema=KeeperReactState,
            checkpointer=InMemorySaver(),
        )


def node_agent(model: ScriptedChatModel, keeper: Keeper) -> Any:
    """A hand-built graph with the keeper's node and the model node that goes with it."""
    node = KeeperNode(keeper, model=model, tools=TOOLS, system_prompt=SYSTEM)
    return hand_built(node, node.model_runnable())


def hand_built(node: KeeperNode, model_node: Any) -> Any:
    graph = StateGraph(KeeperGraphState)
    graph.add_node("keeper", node.as_runnable())
    graph.add_node("model", model_node)
    graph.add_node("tools", ToolNode(list(node.tools)))
    graph.add_edge(START, "keeper")
    graph.add_edge("keeper", "model")
    graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "keeper")
    return graph.compile(checkpointer=InMemorySaver())


ENTRY_POINTS: dict[str, Callable[[ScriptedChatModel, Keeper], Any]] = {
    "create_keeper_agent": keeper_agent,
    "KeeperMiddleware": middleware_agent,
    "pre_model_hook": hook_agent,
    "KeeperNode": node_agent,
}


def keeper_chunks(agent: Any, way: str) -> list[BaseMessage]:
    """Every keeper message a chat UI streaming ``stream_mode="messages"`` would be shown."""
    found: list[BaseMessage] = []

    def take(chunk: BaseMessage) -> None:
        if keeper_kind(chunk) is not None or "[NOTES]" in str(chunk.content):
            found.append(chunk)

    async def astream(text: str) -> None:
        inputs = {"messages": [HumanMessage(text)]}
        async for chunk, _meta in agent.astream(inputs, thread(), stream_mode="messages"):
            take(chunk)

    for text in scenario(TURNS):
        inputs = {"messages": [HumanMessage(text)]}
        if way == "sync":
            for chunk, _meta in agent.stream(inputs, thread(), stream_mode="messages"):
                take(chunk)
        elif way == "async":
            asyncio.run(astream(text))
        else:
            stream = agent.stream(inputs, thread(), stream_mode="messages", subgraphs=True)
            for _namespace, (chunk, _meta) in stream:
                take(chunk)
    return found


def sent(model: ScriptedChatModel) -> list[list[tuple[Any, ...]]]:
    """Every request the model received, as a server reads it (ids are not sent)."""
    return [
        [
            (m.type, m.content, getattr(m, "tool_calls", None), getattr(m, "tool_call_id", None))
            for m in received.messages
        ]
        for received in model.received
    ]


@pytest.mark.parametrize("way", ["sync", "async", "subgraphs"])
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_no_keeper_message_reaches_the_messages_stream_at_defaults(entry, way):
    model, keeper = scripted_model(), Keeper(CONFIG)
    agent = ENTRY_POINTS[entry](model, keeper)
    assert keeper_chunks(agent, way) == []
    values = agent.get_state(thread()).values
    assert [m for m in values["messages"] if keeper_kind(m) is not None] == []
    assert "llm_input_messages" not in values  # no copy of the view a UI could read either
    # the keeper did its work: cuts, and the NOTES and RULES reached the model
    assert keeper.counters(THREAD).cuts >= 2
    findings = inspect(model, keeper)
    assert findings.questions_seen >= 2 and findings.problems == []
    assert keeper_kind(model_view(values["messages"], values["keeper"])[1]) == "notes"


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_the_model_is_sent_what_the_state_writing_option_sends_it(entry):
    """Byte for byte: note calls rendered like work calls, NOTES and RULES where they stood."""
    requests = {}
    for config in (CONFIG, WITH_KEEPER, ALL):
        model, keeper = scripted_model(), Keeper(config)
        agent = ENTRY_POINTS[entry](model, keeper)
        for text in scenario(TURNS):
            agent.invoke({"messages": [HumanMessage(text)]}, thread())
        requests[config.state_messages] = sent(model)
        assert inspect(model, keeper).problems == []
    assert requests[None] == requests["window_with_keeper"] == requests["all"]
    assert any(
        any(kind == "human" and "[NOTES]" in str(text) for kind, text, *_ in r)
        for r in requests[None]
    )


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_the_state_writing_option_writes_them_marked(entry):
    model, keeper = scripted_model(), Keeper(WITH_KEEPER)
    agent = ENTRY_POINTS[entry](model, keeper)
    kinds = {keeper_kind(chunk) for chunk in keeper_chunks(agent, "sync")}
    assert kinds == {"notes", "rules"}
    values = agent.get_state(thread()).values
    assert keeper_kind(values["messages"][1]) == "notes"
    assert "view" not in values["keeper"]


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_the_state_keeps_every_message_when_asked_and_the_model_sees_the_window(entry):
    model, keeper = scripted_model(), Keeper(ALL)
    agent = ENTRY_POINTS[entry](model, keeper)
    texts = list(scenario(TURNS))
    assert keeper_chunks(agent, "sync") == []
    values = agent.get_state(thread()).values
    humans = [m.content for m in values["messages"] if isinstance(m, HumanMessage)]
    assert humans == texts  # nothing pruned, nothing of the keeper's
    assert keeper.counters(THREAD).cuts >= 2
    view = model_view(values["messages"], values["keeper"])
    assert keeper_kind(view[1]) == "notes" and len(view) < len(values["messages"]) // 2
    assert inspect(model, keeper).problems == []
    # a last input is read with the window, not the history
    last = len(model.received)
    agent.invoke({"messages": [HumanMessage("Questions\n1. Anything new?")]}, thread())
    request = model.received[last].messages
    assert isinstance(request[0], SystemMessage) and keeper_kind(request[2]) == "notes"
    assert len(request) < len(values["messages"]) // 2


def test_a_hook_agent_given_a_model_of_its_own_gets_the_keepers_messages_in_its_state():
    """Its model reads ``state["messages"]`` as they are: the NOTES must be there to be read."""
    model, keeper = scripted_model(), Keeper(CONFIG)
    hook = keeper_pre_model_hook(model, tools=TOOLS, system_prompt=SYSTEM, keeper=keeper)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LangGraphDeprecatedSinceV10)
        agent = create_react_agent(
            model,
            hook.tools,
            prompt=SYSTEM,
            pre_model_hook=hook,
            post_model_hook=hook.after_model,
            state_schema=KeeperReactState,
            checkpointer=InMemorySaver(),
        )
    for text in scenario(TURNS):
        agent.invoke({"messages": [HumanMessage(text)]}, thread())
    assert keeper_kind(agent.get_state(thread()).values["messages"][1]) == "notes"
    assert inspect(model, keeper).problems == []


def test_state_messages_takes_only_the_named_settings():
    with pytest.raises(ConfigurationError, match="state_messages='keeper'; use one of window"):
        KeeperConfig(state_messages="keeper")  # type: ignore[arg-type]


@pytest.mark.parametrize("entry", ["agent", "middleware"])
def test_a_state_that_keeps_every_message_still_has_the_memory_of_its_branch(entry):
    """Time travel to before a cut and a new branch from there, with every message kept: the
    branch remembers what a fresh thread fed its history remembers, and its question is shown
    its own RULES only."""
    from tests.branch_runs import CONFIG as BRANCH_CONFIG
    from tests.branch_runs import control, feed, make_run, rules_at_questions
    from tests.test_branches_graph import COMMON, LEFT, QUESTION, RIGHT, completed_after

    run = make_run(entry, InMemorySaver(), Keeper(replace(BRANCH_CONFIG, state_messages="all")))
    feed(run, COMMON + LEFT + [QUESTION])
    before = completed_after(run, "item-5")
    feed(run, [*RIGHT, QUESTION], before.config)
    mine = run.memory()
    assert mine == control(COMMON + RIGHT + [QUESTION])
    assert "answer in French." not in mine.rules and "say it twice." in mine.rules
    shown = rules_at_questions(run.model)
    assert "answer in French." in shown[0] and "say it twice." in shown[1]
    assert "answer in French." not in shown[1]
    kept = [m.id for m in run.state().values["messages"]]
    assert {"task", "item-1", "item-5"} <= set(kept)  # the branch's history, whole


def test_a_model_node_of_your_own_that_reads_the_view_keeps_them_out_of_the_state():
    """``KeeperNode(..., model_reads_view=True)`` and ``KeeperNode.model_input(state)`` in the
    user's own model node: the model gets the NOTES and RULES, the state does not."""
    model, keeper = scripted_model(), Keeper(CONFIG)
    node = KeeperNode(keeper, model=model, tools=TOOLS, system_prompt=SYSTEM, model_reads_view=True)
    bound = model.bind_tools(list(node.tools))

    def call_model(state: KeeperGraphState) -> dict[str, Any]:
        return {"messages": [bound.invoke([SystemMessage(SYSTEM), *node.model_input(state)])]}

    agent = hand_built(node, call_model)
    assert keeper_chunks(agent, "sync") == []
    assert keeper.counters(THREAD).cuts >= 2
    findings = inspect(model, keeper)
    assert findings.questions_seen >= 2 and findings.problems == []


def _walk(value: Any, under_messages: bool, found: list[tuple[bool, BaseMessage]]) -> None:
    """Every message in a streamed chunk, and whether it stood under a ``messages`` key."""
    if isinstance(value, BaseMessage):
        found.append((under_messages, value))
    elif isinstance(value, dict):
        for key, item in value.items():
            _walk(item, under_messages or key == "messages", found)
    elif isinstance(value, list | tuple):
        for item in value:
            _walk(item, under_messages, found)


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_every_stream_mode_with_subgraphs_shows_a_chat_ui_no_keeper_message(entry):
    """``stream_mode=["messages", "updates", "values"]`` with ``subgraphs=True``: what a chat UI
    reads (the messages stream, and the ``messages`` of every update and value) holds no keeper
    message, and any NOTES text anywhere in a chunk is on a marked keeper message."""
    model, keeper = scripted_model(), Keeper(CONFIG)
    agent = ENTRY_POINTS[entry](model, keeper)
    modes = ["messages", "updates", "values"]
    seen: set[str] = set()
    for text in scenario(TURNS):
        inputs = {"messages": [HumanMessage(text)]}
        for _namespace, mode, chunk in agent.stream(
            inputs, thread(), stream_mode=modes, subgraphs=True
        ):
            seen.add(mode)
            found: list[tuple[bool, BaseMessage]] = []
            _walk(chunk[0] if mode == "messages" else chunk, mode == "messages", found)
            for under_messages, message in found:
                if under_messages:
                    assert keeper_kind(message) is None, (mode, message.content)
                if "[NOTES]" in str(message.content):
                    assert is_keeper_message(message), (mode, message.content)
    assert seen == set(modes)
    assert keeper.counters(THREAD).cuts >= 2
