"""KeeperMiddleware in create_agent: every way of running it, a restart from SQLite, and
LangChain's own middleware around it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from langchain.agents.middleware import (
    HumanInTheLoopMiddleware,
    ModelRequest,
    ModelResponse,
    ModelRetryMiddleware,
    ToolCallLimitMiddleware,
    ToolRetryMiddleware,
)
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command

from keeper_middleware import Keeper, KeeperConfig, ThinkingPolicy
from keeper_middleware.integrations.langchain import KeeperMiddleware
from keeper_middleware.messages.facts import keeper_kind
from keeper_middleware.state_view import model_view
from tests.test_integrations_parity import (
    CONFIG,
    SYSTEM,
    THREAD,
    TOOLS,
    archive_contents,
    clerk,
    inspect,
    middleware_agent,
    notes_texts,
    run,
    scenario,
    scripted_model,
    thread,
)

TURNS = 45


def _reference(turns: int = TURNS) -> Keeper:
    keeper = Keeper(CONFIG)
    run(middleware_agent(scripted_model(), keeper), scenario(turns))
    return keeper


@pytest.fixture(scope="module")
def reference() -> Keeper:
    return _reference()


def test_invoke_cuts_the_stored_history_and_keeps_the_bookkeeping_private(reference):
    model, keeper = scripted_model(), Keeper(CONFIG)
    agent = middleware_agent(model, keeper)
    output = None
    for text in scenario(TURNS):
        output = agent.invoke({"messages": [HumanMessage(text)]}, thread())
    assert "keeper" not in output
    stored = agent.get_state(thread()).values
    assert json.loads(json.dumps(stored["keeper"])) == stored["keeper"]
    # the NOTES stand in what the model is sent, not in the state a chat UI reads
    assert all(keeper_kind(m) is None for m in stored["messages"])
    assert keeper_kind(model_view(stored["messages"], stored["keeper"])[1]) == "notes"
    assert len(stored["messages"]) < TURNS  # about four messages a turn were sent
    assert keeper.counters(THREAD).cuts >= 3
    assert inspect(model, keeper).problems == []


def test_each_thread_is_its_own_session():
    keeper = Keeper(CONFIG)
    agent = middleware_agent(scripted_model(), keeper)
    texts = list(scenario(25))
    run(agent, texts, name="north")
    run(agent, [t.replace("The clerk", "The porter") for t in texts], name="south")
    assert sorted(keeper.archive.sessions()) == ["north", "south"]
    assert all("porter" not in t.content for t in keeper.archive.turns("north"))
    assert any("porter" in t.content for t in keeper.archive.turns("south"))


def test_ainvoke_stream_and_astream_archive_what_invoke_does(reference):
    async def ainvoke(agent: Any, text: str) -> None:
        await agent.ainvoke({"messages": [HumanMessage(text)]}, thread())

    async def astream(agent: Any, text: str) -> None:
        async for _ in agent.astream({"messages": [HumanMessage(text)]}, thread()):
            pass

    def stream(agent: Any, text: str) -> None:
        for _ in agent.stream({"messages": [HumanMessage(text)]}, thread(), stream_mode="updates"):
            pass

    for way in (ainvoke, stream, astream):
        model, keeper = scripted_model(), Keeper(CONFIG)
        agent = middleware_agent(model, keeper)
        for text in scenario(TURNS):
            if asyncio.iscoroutinefunction(way):
                asyncio.run(way(agent, text))
            else:
                way(agent, text)
        assert archive_contents(keeper) == archive_contents(reference), way.__name__
        assert notes_texts(keeper) == notes_texts(reference), way.__name__
        assert inspect(model, keeper).problems == []


def test_a_thread_resumes_after_a_restart_from_the_same_sqlite_files(tmp_path, reference):
    archive, checkpoints = tmp_path / "archive.db", str(tmp_path / "checkpoints.db")
    texts = list(scenario(TURNS))
    half = len(texts) // 2
    with SqliteSaver.from_conn_string(checkpoints) as saver:
        keeper = Keeper(CONFIG, archive=archive)
        run(middleware_agent(scripted_model(), keeper, saver), texts[:half])
        cuts_before = keeper.counters(THREAD).cuts
        keeper.close()
    with SqliteSaver.from_conn_string(checkpoints) as saver:
        keeper = Keeper(CONFIG, archive=archive)
        agent = middleware_agent(scripted_model(), keeper, saver)
        assert keeper.counters(THREAD).cuts == cuts_before > 0
        run(agent, texts[half:])
        assert archive_contents(keeper) == archive_contents(reference)
        assert notes_texts(keeper) == notes_texts(reference)
        stored = agent.get_state(thread()).values["messages"]
        assert stored[0].content == texts[0]
        keeper.close()


@pytest.mark.parametrize("keeper_first", [True, False])
def test_retries_of_failed_model_calls_change_nothing_the_keeper_keeps(reference, keeper_first):
    failures = iter(range(10_000))

    def flaky(messages):
        if keeper_kind(messages[-1]) is None and next(failures) % 5 == 0:
            raise ConnectionError("the server went away")
        return clerk(messages)

    model, keeper = scripted_model(), Keeper(CONFIG)
    model.default = flaky
    retry = ModelRetryMiddleware(max_retries=2, initial_delay=0, jitter=False)
    tool_retry = ToolRetryMiddleware(max_retries=1, initial_delay=0, jitter=False)
    others = {"before" if not keeper_first else "after": [retry, tool_retry]}
    run(middleware_agent(model, keeper, **others), scenario(TURNS))
    assert archive_contents(keeper) == archive_contents(reference)
    assert inspect(model, keeper).problems == []


@pytest.mark.parametrize("place", ["before", "after"])
def test_tool_call_limits_count_across_cuts(place):
    model, keeper = scripted_model(), Keeper(CONFIG)
    limit = ToolCallLimitMiddleware(tool_name="lookup", thread_limit=6)
    agent = middleware_agent(model, keeper, **{place: [limit]})
    run(agent, scenario(TURNS))
    stored = agent.get_state(thread()).values["messages"]
    results = [t.content for t in keeper.archive.turns(THREAD) if t.name == "lookup"]
    results += [m.content for m in stored if isinstance(m, ToolMessage) and m.name == "lookup"]
    assert keeper.counters(THREAD).cuts >= 3
    assert sum("is kept on shelf" in r for r in results) == 6
    assert inspect(model, keeper).problems == []


@pytest.mark.parametrize("place", ["before", "after"])
def test_human_review_interrupts_and_resumes_across_cuts(place):
    """Reviewers answer the shelf lookups themselves, at length, so cuts fall on resumes."""
    model, keeper = scripted_model(), Keeper(CONFIG)
    review = HumanInTheLoopMiddleware(interrupt_on={"lookup": True})
    agent = middleware_agent(model, keeper, **{place: [review]})
    answer = {"type": "respond", "message": "On the top shelf, behind the ledgers. " * 30}
    interrupts = cut_on_resume = 0
    for text in scenario(TURNS):
        agent.invoke({"messages": [HumanMessage(text)]}, thread())
        while agent.get_state(thread()).interrupts:
            interrupts += 1
            before = keeper.counters(THREAD).cuts
            agent.invoke(Command(resume={"decisions": [answer]}), thread())
            cut_on_resume += keeper.counters(THREAD).cuts > before
    assert interrupts == TURNS - TURNS // 7
    assert cut_on_resume >= 2
    archived = [t.content for t in keeper.archive.turns(THREAD) if t.role == "tool"]
    assert archived and all(a == answer["message"] for a in archived if "shelf" in a)
    assert inspect(model, keeper).problems == []


# ---- wrap_model_call, tested on hand-built requests

THINKING = ThinkingPolicy(on={"think": True}, off={"think": False}, reasoning_effort="medium")


def _request(middleware: KeeperMiddleware, messages: list[Any]) -> ModelRequest[Any]:
    return ModelRequest(
        model=middleware._model,
        messages=messages,
        system_message=SystemMessage("Another prompt."),
        tools=[*middleware.tools, *TOOLS],
    )


def test_thinking_is_forwarded_and_a_reply_that_thought_to_its_limit_is_asked_again():
    keeper = Keeper(KeeperConfig(window=4096, reply_reserve=512, thinking=THINKING))
    middleware = KeeperMiddleware(scripted_model(), keeper=keeper)
    seen: list[dict[str, Any]] = []
    replies = [
        AIMessage("", response_metadata={"finish_reason": "length"}),
        AIMessage("<think>hm</think>1. five", additional_kwargs={"reasoning_content": "hm"}),
    ]

    def handler(request: ModelRequest[Any]) -> ModelResponse[Any]:
        seen.append(dict(request.model_settings))
        return ModelResponse(result=[replies.pop(0)])

    question = [HumanMessage("Task: count."), HumanMessage("What is five?")]
    response = middleware.wrap_model_call(_request(middleware, question), handler)
    assert seen == [
        {"reasoning_effort": "medium", "think": True},
        {"reasoning_effort": "medium", "think": False},
    ]
    assert response.result[0].content == "1. five"
    assert "reasoning_content" not in response.result[0].additional_kwargs
    assert keeper.counters("default").thinking_retries == 1


def test_async_wrap_model_call_does_the_same():
    keeper = Keeper(KeeperConfig(window=4096, reply_reserve=512, thinking=THINKING))
    middleware = KeeperMiddleware(scripted_model(), keeper=keeper)

    async def handler(request: ModelRequest[Any]) -> ModelResponse[Any]:
        return ModelResponse(result=[AIMessage(f"settings {sorted(request.model_settings)}")])

    request = _request(middleware, [HumanMessage("Task: count.")])
    response = asyncio.run(middleware.awrap_model_call(request, handler))
    assert response.result[0].content == "settings ['reasoning_effort', 'think']"


def test_note_calls_render_like_the_latest_request():
    model = scripted_model()
    middleware = KeeperMiddleware(model, tools=TOOLS, system_prompt=SYSTEM, keeper=Keeper(CONFIG))
    assert middleware.setup.system_prompt == SYSTEM
    assert [t.name for t in middleware.setup.tools] == ["search_archive", "lookup"]
    middleware.wrap_model_call(
        _request(middleware, [HumanMessage("Task: count.")]),
        lambda request: ModelResponse(result=[AIMessage("ok")]),
    )
    assert middleware.setup.system_prompt == "Another prompt."
