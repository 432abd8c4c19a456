"""One set of invariants, held over realistic agent traffic through every entry point.

Sessions come from ``bench/keeper_bench/traffic.py`` (coding-agent sessions with 1K–500K-character file reads
and test logs, parallel tool calls, pasted text, verbose replies, CJK/Japanese/emoji, search
loops and hostile search arguments; and the second round's shapes: a history imported at once,
bursts of 50+ parallel results, content blocks, item numbers that go back, a model that never
stops searching), deterministic by seed. Each runs through
``create_keeper_agent``, a hand-built ``StateGraph`` with ``KeeperNode``, ``KeeperMiddleware``
with ``create_agent``, ``keeper_pre_model_hook`` with ``create_react_agent``, and the proxy
(in-process ASGI; answering in JSON and streamed as server-sent events). For every request the model received:

- it is within the window by the configured counter;
- the system message is first, and the only one;
- no tool call is without its result, and no result without its call;
- when the latest input is a question and the NOTES hold rules, the rules are beside it;

and after every run: every turn is archived at most once, every user input (and every imported
message) is in view or in the archive word for word, and every run ended. A disk that fills
mid-session (a small tmpfs) stops a step with an ``ArchiveError``, and the thread goes on once
there is room, with the same invariants.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
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

from keeper_bench.traffic import (
    KINDS,
    ROUND_TWO,
    RULE,
    Session,
    TrafficModel,
    coding_session,
)
from keeper_middleware import (
    ArchiveError,
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
from keeper_middleware.integrations.proxy import create_proxy_app
from keeper_middleware.integrations.proxy.conversation.chat_messages import (
    message_from_openai,
    message_to_openai,
)
from keeper_middleware.messages.blocks import content_as_text
from keeper_middleware.messages.facts import keeper_kind, text_of
from keeper_middleware.notes.block import parse_notes
from keeper_middleware.reinjection.questions import PatternQuestionDetector
from keeper_middleware.search.guards import STOP_LINE
from keeper_middleware.search.schema import SEARCH_TOOL_NAME
from tests.fake_model import ScriptedChatModel
from tests.proxy_upstream import FAST_RETRY, as_sse, completion, sse_payloads
from tests.small_disk import fill

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
ROUND_TWO_SESSIONS = {
    "burst+blocks+loop": {"seed": 9, "turns": 10, "kinds": ROUND_TWO},
    "imported+renumbered": {"seed": 30, "turns": 8, "kinds": ROUND_TWO, "imported": 600},
}
"""Sessions of the second round's shapes (which each holds is pinned by a test below)."""
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
    offered: list[bool] | None = None
    """For each request, whether it offered the search tool."""

    def __post_init__(self) -> None:
        if self.offered is None:
            self.offered = [True] * len(self.requests)


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
    """The text of every user input, as the archive keeps it (content blocks as text)."""
    yield session.task
    for turn in session.turns:
        yield content_as_text(session.user_content(turn))


def arrivals(session: Session) -> Iterator[list[BaseMessage]]:
    """What each invoke sends: the task with any imported history, then one input a turn."""
    yield [HumanMessage(session.task), *session.imported]
    for turn in session.turns:
        yield [HumanMessage(session.user_content(turn))]


@dataclass
class FullDisk:
    """Fills ``disk`` before input ``at``; the step that then fails with the disk full (an
    ``ArchiveError``, or the proxy's error naming it) frees the disk again, and is run again."""

    disk: Path
    at: int = 3
    filler: Path | None = None
    failures: list[str] = field(default_factory=list)

    def before(self, number: int) -> None:
        if number == self.at:
            self.filler = fill(self.disk)

    def recovered(self, text: str) -> bool:
        if self.filler is None or "full" not in text or str(self.disk) not in text:
            return False
        self.failures.append(text)
        self.filler.unlink()
        self.filler = None
        return True


def drive(agent: Any, session: Session, faults: FullDisk | None = None) -> list[BaseMessage]:
    config = {"configurable": {"thread_id": THREAD}, **LIMIT}
    out: dict[str, Any] = {}
    for number, sent in enumerate(arrivals(session)):
        if faults is not None:
            faults.before(number)
        try:
            out = agent.invoke({"messages": sent}, config)
        except ArchiveError as exc:
            if faults is None or not faults.recovered(str(exc)):
                raise
            out = agent.invoke(None, config)  # the failed step again, from the checkpoint
    return list(out["messages"])


def scripted(session: Session) -> ScriptedChatModel:
    return ScriptedChatModel(default=TrafficModel(session))


def schemas_of(tools: Sequence[Any]) -> list[dict[str, Any]]:
    return [convert_to_openai_tool(t) for t in tools]


def scripted_run(
    model: ScriptedChatModel, schemas: list[dict[str, Any]], keeper: Keeper, view: list[BaseMessage]
) -> Run:
    requests = [r.messages for r in model.received]
    offered = [SEARCH_TOOL_NAME in r.tools for r in model.received]
    return Run(requests, schemas, keeper, THREAD, view, offered=offered)


# ------------------------------------------------------------------------- the entry points


def run_agent(session: Session, archive: Any = ":memory:", faults: FullDisk | None = None) -> Run:
    keeper, model, tools = Keeper(CONFIG, archive=archive), scripted(session), tools_for(session)
    agent = create_keeper_agent(
        model,
        tools,
        system_prompt=session.system_prompt,
        keeper=keeper,
        checkpointer=InMemorySaver(),
    )
    view = drive(agent, session, faults)
    node = KeeperNode(keeper, model=model, tools=tools, system_prompt=session.system_prompt)
    return scripted_run(model, node.setup.tool_schemas, keeper, view)


def run_graph(session: Session, archive: Any = ":memory:", faults: FullDisk | None = None) -> Run:
    keeper, model, tools = Keeper(CONFIG, archive=archive), scripted(session), tools_for(session)
    node = KeeperNode(keeper, model=model, tools=tools, system_prompt=session.system_prompt)
    graph = StateGraph(KeeperGraphState)
    graph.add_node("keeper", node.as_runnable())
    graph.add_node("model", node.model_runnable())
    graph.add_node("tools", ToolNode([t for t in node.tools if not isinstance(t, dict)]))
    graph.add_edge(START, "keeper")
    graph.add_edge("keeper", "model")
    graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "keeper")
    view = drive(graph.compile(checkpointer=InMemorySaver()), session, faults)
    return scripted_run(model, node.setup.tool_schemas, keeper, view)


def run_middleware(
    session: Session, archive: Any = ":memory:", faults: FullDisk | None = None
) -> Run:
    keeper, model, tools = Keeper(CONFIG, archive=archive), scripted(session), tools_for(session)
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
    view = drive(agent, session, faults)
    return scripted_run(model, middleware.setup.tool_schemas, keeper, view)


def run_hook(session: Session, archive: Any = ":memory:", faults: FullDisk | None = None) -> Run:
    # create_react_agent checkpoints the model's reply before any hook sees it, and LangGraph's
    # checkpointer cannot store 2**70 or a lone surrogate: the model here sends them storable
    # (the node, the middleware and the proxy make them so themselves)
    keeper, tools = Keeper(CONFIG, archive=archive), tools_for(session)
    model = ScriptedChatModel(default=TrafficModel(session, storable=True))
    hook = keeper_pre_model_hook(
        model, tools=tools, system_prompt=session.system_prompt, keeper=keeper
    )
    agent = create_react_agent(
        hook.model,
        hook.tools,
        prompt=session.system_prompt,
        pre_model_hook=hook,
        state_schema=KeeperReactState,
        checkpointer=InMemorySaver(),
    )
    view = drive(agent, session, faults)
    return scripted_run(model, schemas_of(hook.tools), keeper, view)


def run_proxy(
    session: Session, tmp_path: Path, *, stream: bool = False, faults: FullDisk | None = None
) -> Run:
    """An OpenAI-style agent that sends its whole history every time, through the proxy
    (``stream``: asking for server-sent events, which the upstream then sends too)."""
    model = TrafficModel(session)
    received: list[list[BaseMessage]] = []
    offered: list[bool] = []
    schemas: list[dict[str, Any]] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        messages = [message_from_openai(m) for m in body["messages"]]
        received.append(messages)
        names = [t["function"]["name"] for t in body.get("tools") or []]
        offered.append(SEARCH_TOOL_NAME in names)
        if SEARCH_TOOL_NAME in names or not schemas:
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
            for number, sent in enumerate(arrivals(session)):
                if faults is not None:
                    faults.before(number)
                history += [message_to_openai(m) for m in sent]
                for _ in range(20):
                    body = {"model": "m", "messages": history, "tools": agent_tools}
                    for _attempt in range(2):  # the same request again once there is room
                        response = await client.post(
                            "/v1/chat/completions",
                            json={**body, "stream": stream},
                            headers={"X-Keeper-Session": THREAD},
                        )
                        if response.status_code == 200 or not (
                            faults and faults.recovered(response.text)
                        ):
                            break
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
                            {
                                "role": "tool",
                                "tool_call_id": call["id"],
                                # a JSON block goes over the wire as text
                                "content": content_as_text(result),
                            }
                        )

    asyncio.run(talk())
    keeper = app.state.proxy.keeper
    (stored,) = app.state.proxy.sessions()  # the session's name as the proxy stores it
    view = list(app.state.proxy.record(stored).window)
    return Run(
        received, schemas, keeper, stored, view, close=app.state.proxy.aclose, offered=offered
    )


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


def check_request(
    run: Run, messages: list[BaseMessage], *, note_call: bool = False, offered: bool = True
) -> None:
    schemas = run.schemas
    if not offered:  # the search tool was withheld from this call
        schemas = [t for t in schemas if t["function"]["name"] != SEARCH_TOOL_NAME]
    size = run.keeper.tokens.count_messages(messages, schemas)
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
    assert run.offered is not None
    for messages, offered in zip(run.requests, run.offered, strict=True):
        note_call = keeper_kind(messages[-1]) in ("notes_request", "notes_reask")
        check_request(run, messages, note_call=note_call, offered=offered or note_call)
    ids = [t.msg_id for t in run.keeper.archive.turns(run.session)]
    assert len(ids) == len(set(ids)), "a turn was archived twice"
    archived = {t.content for t in run.keeper.archive.turns(run.session)}
    in_view = {text_of(m) for m in run.final_view}
    for text in inputs(session):
        assert text in archived or text in in_view, f"an input was lost: {text[:60]!r}"
    for message in session.imported:
        text = text_of(message)
        if text:
            assert text in archived or text in in_view, f"an import was lost: {text[:60]!r}"
    assert RULE in run.keeper.notes(run.session).rules or run.keeper.counters(run.session).cuts == 0
    for messages, offered in zip(run.requests, run.offered, strict=True):
        if kind_of(messages[-1]) in ("notes_request", "notes_reask") or text_of(
            messages[-1]
        ).startswith(("[NOTES REQUEST]", "[NOTES CHECK]")):
            continue
        latest = max(
            (i for i, m in enumerate(messages) if isinstance(m, HumanMessage) and not kind_of(m)),
            default=0,
        )
        stopped = any(
            isinstance(m, ToolMessage) and STOP_LINE in text_of(m) for m in messages[latest:]
        )
        assert not (stopped and offered), "the search tool was offered after the stop line"


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


# ------------------------------------------------------------------------- the second round


def round_two(name: str) -> Session:
    return coding_session(**ROUND_TWO_SESSIONS[name])


@pytest.mark.parametrize("name", sorted(ROUND_TWO_SESSIONS))
@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_round_two_traffic_keeps_every_invariant(entry, name):
    session = round_two(name)
    run = ENTRY_POINTS[entry](session)
    check_run(run, session)
    assert run.keeper.counters(THREAD).cuts >= 1
    if any(turn.kind == "loop" for turn in session.turns):  # the loop met the stop line
        assert run.keeper.counters(THREAD).search_stops >= 1


@pytest.mark.parametrize("name", sorted(ROUND_TWO_SESSIONS))
def test_round_two_traffic_through_the_proxy_keeps_every_invariant(name, tmp_path):
    session = round_two(name)
    run = run_proxy(session, tmp_path)
    try:
        check_run(run, session)
        if any(turn.kind == "loop" for turn in session.turns):
            assert run.keeper.counters(run.session).search_stops >= 1
    finally:
        assert run.close is not None
        asyncio.run(run.close())


def test_the_round_two_sessions_hold_the_shapes_they_are_named_for():
    burst, imported = round_two("burst+blocks+loop"), round_two("imported+renumbered")
    kinds = {turn.kind for turn in burst.turns}
    assert {"burst", "blocks", "loop"} <= kinds
    assert max(len(round_) for t in burst.turns for round_ in t.rounds) >= 50
    assert len(imported.imported) >= 600
    assert "renumber" in {turn.kind for turn in imported.turns}
    numbers = [int(t.user.split(".")[0].split()[1]) for t in imported.turns if t.kind == "renumber"]
    assert any(later < earlier for earlier, later in itertools.pairwise(numbers))
    assert coding_session(3, turns=30) == coding_session(3, turns=30, kinds=KINDS)


# ------------------------------------------------------------------------- archive faults

FAULTY = {"seed": 2, "turns": 10, "max_chars": 20_000}
"""A session whose archive fills a small disk (file reads and logs of at most 20K characters)."""


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_a_disk_that_fills_mid_session_stops_a_step_and_loses_nothing(entry, small_disk):
    session = coding_session(**FAULTY)
    faults = FullDisk(small_disk)
    run = ENTRY_POINTS[entry](session, small_disk / "agent.sqlite3", faults)
    assert faults.failures, "the disk never filled"
    check_run(run, session)


def test_a_disk_that_fills_under_the_proxy_stops_a_request_and_loses_nothing(small_disk):
    session = coding_session(**FAULTY)
    faults = FullDisk(small_disk)
    run = run_proxy(session, small_disk, faults=faults)
    try:
        assert faults.failures, "the disk never filled"
        check_run(run, session)
    finally:
        assert run.close is not None
        asyncio.run(run.close())
