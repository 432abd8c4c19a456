"""Models as LangChain takes them: an ``init_chat_model`` string, a model that cannot bind tools
(a clear error naming ``search=False``, and ``search=False`` working), and a real HTTP server
that refuses requests carrying tools."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from langchain_core.language_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from keeper_bench.reader.server import create_reader_app, serve_reader
from keeper_middleware import KeeperConfig, KeeperError, create_keeper_agent
from keeper_middleware.errors import ConfigurationError, ToolsNotSupportedError
from keeper_middleware.integrations.langchain import KeeperMiddleware, keeper_pre_model_hook
from keeper_middleware.integrations.proxy.cli import serve_in_thread
from keeper_middleware.messages.facts import text_of

SYSTEM = "You read stories and answer questions about them."
RULE = (
    "Read each item. Standing rule: any figure below zero, whether recorded or worked out, is "
    "reported as the single word overdrawn."
)
CONFIG = KeeperConfig(window=4096, notes_every_items=5)


def story_turns(items: int) -> Iterator[str]:
    yield RULE
    for item in range(1, items + 1):
        yield (
            f"Item {item}.\nMira Holt recorded domo{item:02d} at {item * 3}. "
            f"Tomas Quill took {item * 4} from domo{item:02d}."
        )
    yield (
        'Questions about the stories so far. Answer each on its own line as "N. answer"; answer '
        "unknown if the stories never say.\n1. What value does domo03 hold now?\n"
        "2. Who changed domo03 in item 3?"
    )


def run_story(agent: Any, items: int = 14) -> str:
    thread = {"configurable": {"thread_id": "story"}}
    out: dict[str, Any] = {}
    for text in story_turns(items):
        out = agent.invoke({"messages": [HumanMessage(text)]}, thread)
    return text_of(out["messages"][-1])


@pytest.fixture
def openai_env(monkeypatch) -> Iterator[str]:
    with serve_reader() as url:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-local")
        monkeypatch.setenv("OPENAI_BASE_URL", url)
        monkeypatch.setenv("OPENAI_API_BASE", url)
        yield url


def test_a_model_string_runs_the_agent_against_a_real_server(openai_env):
    agent = create_keeper_agent(
        "openai:simulated-reader",
        system_prompt=SYSTEM,
        config=CONFIG,
        checkpointer=InMemorySaver(),
    )
    answer = run_story(agent)
    assert answer.split() == ["1.", "overdrawn", "2.", "Mira", "Holt"]
    assert agent.keeper.counters("story").cuts >= 2


def test_a_model_string_works_in_the_middleware_and_the_hook(openai_env):
    from langchain_openai import ChatOpenAI

    middleware = KeeperMiddleware("openai:simulated-reader", system_prompt=SYSTEM, config=CONFIG)
    hook = keeper_pre_model_hook("openai:simulated-reader", system_prompt=SYSTEM, config=CONFIG)
    assert isinstance(middleware._model, ChatOpenAI)
    assert isinstance(hook.node._raw_model, ChatOpenAI)


def test_something_that_is_not_a_model_is_a_configuration_error():
    with pytest.raises(ConfigurationError, match="openai:gpt-4o"):
        create_keeper_agent(42)  # type: ignore[arg-type]


def fake_replies() -> GenericFakeChatModel:
    return GenericFakeChatModel(messages=iter([AIMessage("noted") for _ in range(50)]))


def test_a_model_that_cannot_bind_tools_is_told_about_search_false():
    with pytest.raises(ToolsNotSupportedError, match="search=False") as caught:
        create_keeper_agent(fake_replies())
    assert isinstance(caught.value, KeeperError)
    with pytest.raises(ToolsNotSupportedError, match="search=False"):
        KeeperMiddleware(fake_replies())._note_model()


def test_search_false_runs_without_any_tool(tmp_path):
    agent = create_keeper_agent(
        fake_replies(),
        search=False,
        config=KeeperConfig(window=2048, notes_every_items=3),
        archive=tmp_path / "a.sqlite3",
        checkpointer=InMemorySaver(),
    )
    thread = {"configurable": {"thread_id": "t"}}
    for item in range(1, 8):
        out = agent.invoke({"messages": [HumanMessage(f"Item {item}. r{item} is {item}.")]}, thread)
    assert text_of(out["messages"][-1]) == "noted"
    assert "tools" not in agent.get_graph().nodes
    assert agent.keeper.counters("t").note_requests >= 1


def refusing_app() -> Starlette:
    """A server like a plain completion endpoint: any request with tools is a 400."""
    reader = create_reader_app()
    forward = httpx.AsyncClient(transport=httpx.ASGITransport(app=reader), base_url="http://r")

    async def chat(request: Request) -> Response:
        body = json.loads(await request.body())
        if body.get("tools"):
            return JSONResponse(
                {"error": {"message": "this model does not support tools", "type": "invalid"}},
                status_code=400,
            )
        answered = await forward.post("/v1/chat/completions", json=body)
        return Response(answered.content, answered.status_code, media_type="application/json")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def test_a_server_that_refuses_tools_gets_a_clear_error_and_search_false_works():
    from langchain_openai import ChatOpenAI

    with serve_in_thread(refusing_app(), lifespan="off") as url:
        model = ChatOpenAI(model="simulated-reader", base_url=url, api_key="x", max_retries=0)
        agent = create_keeper_agent(model, system_prompt=SYSTEM, config=CONFIG)
        with pytest.raises(ToolsNotSupportedError, match="search=False"):
            agent.invoke({"messages": [HumanMessage(RULE)]})
        plain = create_keeper_agent(
            model, system_prompt=SYSTEM, config=CONFIG, search=False, checkpointer=InMemorySaver()
        )
        assert run_story(plain, items=6).startswith("1.")


def test_the_middleware_with_search_false_adds_no_tool_and_still_cuts():
    from langchain.agents import create_agent

    model = fake_replies()
    middleware = KeeperMiddleware(
        model, search=False, config=KeeperConfig(window=2048, notes_every_items=3)
    )
    assert middleware.tools == []
    agent = create_agent(model, [], middleware=[middleware], checkpointer=InMemorySaver())
    thread = {"configurable": {"thread_id": "m"}}
    for item in range(1, 9):
        agent.invoke({"messages": [HumanMessage(f"Item {item}. r{item} is {item}.")]}, thread)
    assert middleware.keeper.counters("m").note_requests >= 1
    assert middleware.keeper.archive.turn_count("m") > 0
