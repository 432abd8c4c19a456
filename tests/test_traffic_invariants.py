"""One set of invariants, held over realistic agent traffic through every entry point.

Sessions come from ``bench/traffic.py`` (coding-agent sessions with 1K–500K-character file reads
and test logs, parallel tool calls, pasted text, verbose replies, CJK/Japanese/emoji, search
loops and hostile search arguments), deterministic by seed. Each runs through
``create_keeper_agent``, a hand-built ``StateGraph`` with ``KeeperNode``, ``KeeperMiddleware``
with ``create_agent``, ``keeper_pre_model_hook`` with ``create_react_agent``, and the proxy
(in-process ASGI; answering in JSON and streamed as server-sent events). For every request the model received:

- it is within the window by the configured counter;
- the system message is first, and the only one;
- no tool call is without its result, and no result without its call;
- when the latest input is a question and the NOTES hold rules, the rules are beside it;

and after every run: every turn is archived at most once, every user input is in view or in the
archive word for word, and every run ended.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
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

from keeper_middleware import (
    Keeper,
    KeeperConfig,
    KeeperGraphState,
    KeeperNode,
    create_keeper_agent,
)
from keeper_middleware.bench.traffic import RULE, Session, TrafficModel, coding_session
from keeper_middleware.integrations.langchain import (
    KeeperMiddleware,
    KeeperReactState,
    keeper_pre_model_hook,
)
from keeper_middleware.integrations.proxy import create_proxy_app
from keeper_middleware.integrations.proxy.openai_format import message_from_openai
from keeper_middleware.messages import keeper_kind, text_of
from keeper_middleware.notes import parse_notes
from keeper_middleware.questions import PatternQuestionDetector
from tests.fake_model import ScriptedChatModel
from tests.proxy_upstream import FAST_RETRY, as_sse, completion, sse_payloads

pytestmark = pytest.mark.filterwarnings(
    "ignore:create_react_agent has been moved:langgraph.warnings.LangGraphDeprecatedSinceV10"
)
CONFIG = KeeperConfig(window=8192, reply_reserve=1024, notes_every_items=4)


def _seeds(default: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """``KEEPER_TRAFFIC_SEEDS=4-29:16`` runs other conversations: seeds 4 to 29, 16 turns each
    (several ranges separated by commas), for a longer search for a broken invariant than the
    suite's own few."""
    spec = os.environ.get("KEEPER_TRAFFIC_SEEDS", "").strip()
    if not spec:
        return default
    chosen: list[tuple[int, int]] = []
    for part in spec.split(","):
        seeds, _, turns = part.partition(":")
        first, _, last = seeds.partition("-")
        chosen += [(s, int(turns or 10)) for s in range(int(first), int(last or first) + 1)]
    return tuple(chosen)


SEEDS = _seeds(((1, 10), (2, 10), (3, 10), (4, 16)))
"""(seed, turns): seed 4's first cut is made in the step its first question arrives."""
THREAD = "traffic"
LIMIT = {"recursion_limit": 400}
DETECTOR = PatternQuestionDetector(CONFIG.question_patterns)


@dataclass
class Run:
    """What a run left to check: every request the model received, and the engine."""

    requests: list[list[BaseMessage]]
    schemas: list[dict[str, Any]]
    keeper: Keeper
    session: str
    final_view: list[BaseMessage]
    close: Callable[[], Any] | None = None


def tools_for(session: Session) -> list[BaseTool]:
    @tool
    def read_file(path: str) -> str:
        """Read a file of the repository."""
        return session.tool_result("read_file", {"path": path})

    @tool
    def run_tests(target: str) -> str:
        """Run one module's tests and return the log."""
        return session.tool_result("run_tests", {"target": target})

    return [read_file, run_tests]


def inputs(session: Session) -> Iterator[str]:
    yield session.task
    for turn in session.turns:
        yield turn.user


def drive(agent: Any, session: Session, **extra: Any) -> list[BaseMessage]:
    config = {"configurable": {"thread_id": THREAD}, **LIMIT}
    out: dict[str, Any] = {}
    for text in inputs(session):
        out = agent.invoke({"messages": [HumanMessage(text)]}, config, **extra)
    return list(out["messages"])


def scripted(session: Session) -> ScriptedChatModel:
    return ScriptedChatModel(default=TrafficModel(session))


def schemas_of(tools: Sequence[Any]) -> list[dict[str, Any]]:
    return [convert_to_openai_tool(t) for t in tools]


# ------------------------------------------------------------------------- the entry points


def run_agent(session: Session) -> Run:
    keeper, model, tools = Keeper(CONFIG), scripted(session), tools_for(session)
    agent = create_keeper_agent(
        model,
        tools,
        system_prompt=session.system_prompt,
        keeper=keeper,
        checkpointer=InMemorySaver(),
    )
    view = drive(agent, session)
    node = KeeperNode(keeper, model=model, tools=tools, system_prompt=session.system_prompt)
    return Run([r.messages for r in model.received], node.setup.tool_schemas, keeper, THREAD, view)


def run_graph(session: Session) -> Run:
    keeper, model, tools = Keeper(CONFIG), scripted(session), tools_for(session)
    node = KeeperNode(keeper, model=model, tools=tools, system_prompt=session.system_prompt)
    graph = StateGraph(KeeperGraphState)
    graph.add_node("keeper", node.as_runnable())
    graph.add_node("model", node.model_runnable())
    graph.add_node("tools", ToolNode([t for t in node.tools if not isinstance(t, dict)]))
    graph.add_edge(START, "keeper")
    graph.add_edge("keeper", "model")
    graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "keeper")
    view = drive(graph.compile(checkpointer=InMemorySaver()), session)
    return Run([r.messages for r in model.received], node.setup.tool_schemas, keeper, THREAD, view)


def run_middleware(session: Session) -> Run:
    keeper, model, tools = Keeper(CONFIG), scripted(session), tools_for(session)
    middleware = KeeperMiddleware(
        model, tools=tools, system_prompt=session.system_prompt, keeper=keeper
    )
    agent = create_agent(
        model,
        tools,
        system_prompt=session.system_prompt,
        middleware=[middleware],
        checkpointer=InMemorySaver(),
    )
    view = drive(agent, session)
    return Run(
        [r.messages for r in model.received], middleware.setup.tool_schemas, keeper, THREAD, view
    )


def run_hook(session: Session) -> Run:
    # create_react_agent checkpoints the model's reply before any hook sees it, and LangGraph's
    # checkpointer cannot store 2**70 or a lone surrogate: the model here sends them storable
    # (the node, the middleware and the proxy make them so themselves)
    keeper, tools = Keeper(CONFIG), tools_for(session)
    model = ScriptedChatModel(default=TrafficModel(session, storable=True))
    hook = keeper_pre_model_hook(
        model, tools=tools, system_prompt=session.system_prompt, keeper=keeper
    )
    agent = create_react_agent(
        model,
        hook.tools,
        prompt=session.system_prompt,
        pre_model_hook=hook,
        state_schema=KeeperReactState,
        checkpointer=InMemorySaver(),
    )
    view = drive(agent, session)
    return Run([r.messages for r in model.received], schemas_of(hook.tools), keeper, THREAD, view)


def run_proxy(session: Session, tmp_path: Path, *, stream: bool = False) -> Run:
    """An OpenAI-style agent that sends its whole history every time, through the proxy
    (``stream``: asking for server-sent events, which the upstream then sends too)."""
    model = TrafficModel(session)
    received: list[list[BaseMessage]] = []
    schemas: list[dict[str, Any]] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        messages = [message_from_openai(m) for m in body["messages"]]
        received.append(messages)
        schemas[:] = body.get("tools") or []
        reply = model(messages)
        if isinstance(reply, str):
            message: dict[str, Any] = {"role": "assistant", "content": reply}
        else:
            calls = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": json.dumps(c["args"])},
                }
                for c in reply.tool_calls
            ]
            message = {"role": "assistant", "content": None, "tool_calls": calls}
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        if body.get("stream"):
            events = as_sse(completion(message, finish=finish))
            return httpx.Response(
                200, content=events, headers={"content-type": "text/event-stream"}
            )
        return httpx.Response(200, json=completion(message, finish=finish))

    app = create_proxy_app(
        "http://upstream.test/v1",
        archive_dir=tmp_path,
        window=CONFIG.window,
        config=CONFIG,
        retry=FAST_RETRY,
        transport=httpx.MockTransport(upstream),
        max_upstream_calls=40,
    )
    agent_tools = [convert_to_openai_tool(t) for t in tools_for(session)]

    async def talk() -> None:
        history: list[dict[str, Any]] = [{"role": "system", "content": session.system_prompt}]
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy.test") as client:
            for text in inputs(session):
                history.append({"role": "user", "content": text})
                for _ in range(20):
                    body = {"model": "m", "messages": history, "tools": agent_tools}
                    response = await client.post(
                        "/v1/chat/completions",
                        json={**body, "stream": stream},
                        headers={"X-Keeper-Session": THREAD},
                    )
                    assert response.status_code == 200, response.text
                    if stream:
                        reply = reassembled(sse_payloads(response.text))
                    else:
                        reply = response.json()["choices"][0]["message"]
                    history.append(reply)
                    if not reply.get("tool_calls"):
                        break
                    for call in reply["tool_calls"]:
                        args = json.loads(call["function"]["arguments"])
                        result = session.tool_result(call["function"]["name"], args)
                        history.append(
                            {"role": "tool", "tool_call_id": call["id"], "content": result}
                        )

    asyncio.run(talk())
    keeper = app.state.proxy.keeper
    (stored,) = app.state.proxy.sessions()  # the session's name as the proxy stores it
    view = list(app.state.proxy.record(stored).window)
    return Run(received, schemas, keeper, stored, view, close=app.state.proxy.aclose)


def reassembled(events: list[Any]) -> dict[str, Any]:
    """The assistant message a streaming client builds from the events' deltas."""
    content = ""
    calls: dict[int, dict[str, Any]] = {}
    for event in events:
        assert event == "[DONE]" or "error" not in event, event
        for choice in [] if event == "[DONE]" else event.get("choices", []):
            delta = choice.get("delta", {})
            content += delta.get("content") or ""
            for part in delta.get("tool_calls") or []:
                call = calls.setdefault(
                    part["index"], {"type": "function", "function": {"name": "", "arguments": ""}}
                )
                call["id"] = part.get("id") or call.get("id")
                for key in ("name", "arguments"):
                    call["function"][key] += (part.get("function") or {}).get(key) or ""
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [calls[index] for index in sorted(calls)]
    return message


ENTRY_POINTS: dict[str, Callable[..., Run]] = {
    "create_keeper_agent": run_agent,
    "StateGraph+KeeperNode": run_graph,
    "KeeperMiddleware": run_middleware,
    "pre_model_hook": run_hook,
}


# ------------------------------------------------------------------------- the invariants


def kind_of(message: BaseMessage) -> str | None:
    """The keeper's kind of a message; over the wire (the proxy) the tag is gone, so by text."""
    kind = keeper_kind(message)
    if kind is None and isinstance(message, HumanMessage):
        text = text_of(message)
        kind = (
            "notes"
            if text.startswith("[NOTES]")
            else "rules"
            if text.startswith("[RULES]")
            else None
        )
    return kind


def check_request(run: Run, messages: list[BaseMessage], *, note_call: bool = False) -> None:
    size = run.keeper.tokens.count_messages(messages, run.schemas)
    assert size <= run.keeper.config.budget, f"a request of {size} tokens went out"
    assert isinstance(messages[0], SystemMessage)
    assert not any(isinstance(m, SystemMessage) for m in messages[1:])
    calls: set[str] = set()
    for index, message in enumerate(messages):
        if isinstance(message, AIMessage):
            ids = [c["id"] for c in message.tool_calls]
            after = messages[index + 1 : index + 1 + len(ids)]
            answered = {m.tool_call_id for m in after if isinstance(m, ToolMessage)}
            assert set(ids) <= answered, "a tool call went out without its result"
            calls.update(ids)
        if isinstance(message, ToolMessage):
            assert message.tool_call_id in calls, "a tool result went out without its call"
    notes = [parse_notes(text_of(m))[0] for m in messages if kind_of(m) == "notes"]
    inputs_ = [
        i
        for i, m in enumerate(messages)
        if isinstance(m, HumanMessage) and kind_of(m) is None and not text_of(m).startswith("[")
    ]
    question = inputs_ and DETECTOR.is_question(messages[inputs_[-1]])
    if not note_call and notes and notes[0].rules and question:
        beside = [kind_of(m) for m in messages[inputs_[-1] + 1 :]]
        assert "rules" in beside, "a question went out without the rules beside it"


def check_run(run: Run, session: Session) -> None:
    assert run.requests, "the model was never called"
    for messages in run.requests:
        note_call = keeper_kind(messages[-1]) in ("notes_request", "notes_reask")
        check_request(run, messages, note_call=note_call)
    ids = [t.msg_id for t in run.keeper.archive.turns(run.session)]
    assert len(ids) == len(set(ids)), "a turn was archived twice"
    archived = {t.content for t in run.keeper.archive.turns(run.session)}
    in_view = {text_of(m) for m in run.final_view}
    for text in inputs(session):
        assert text in archived or text in in_view, f"an input was lost: {text[:60]!r}"
    assert RULE in run.keeper.notes(run.session).rules or run.keeper.counters(run.session).cuts == 0


@pytest.mark.parametrize(("seed", "turns"), SEEDS)
@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_realistic_traffic_keeps_every_invariant(entry, seed, turns):
    session = coding_session(seed, turns=turns)
    run = ENTRY_POINTS[entry](session)
    check_run(run, session)
    assert run.keeper.counters(THREAD).cuts >= 1


@pytest.mark.parametrize("stream", [False, True], ids=["json", "streamed"])
@pytest.mark.parametrize(("seed", "turns"), SEEDS)
def test_realistic_traffic_through_the_proxy_keeps_every_invariant(seed, turns, stream, tmp_path):
    session = coding_session(seed, turns=turns)
    run = run_proxy(session, tmp_path, stream=stream)
    try:
        check_run(run, session)
    finally:
        assert run.close is not None
        asyncio.run(run.close())


def test_the_traffic_is_deterministic_and_realistic():
    sessions = [coding_session(seed, turns=30) for seed in range(4)]
    assert coding_session(2, turns=30) == sessions[2]
    kinds = {turn.kind for s in sessions for turn in s.turns}
    assert kinds == {"read", "tests", "parallel", "paste", "question", "hostile", "verbose"}
    sizes = [len(text) for s in sessions for text in s.files.values()]
    assert min(sizes) < 5_000 and max(sizes) > 100_000
    texts = "".join(t.user + t.reply for s in sessions for t in s.turns)
    assert any("\u4e00" <= c <= "\u9fff" for c in texts)  # CJK
    assert any("\u30a0" <= c <= "\u30ff" for c in texts)  # katakana
