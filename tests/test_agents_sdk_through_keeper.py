"""An openai-agents ``Runner`` with a Responses model, through keeper-proxy, plays a coding
session long enough for several cuts: every answer right, every turn archived once, the NOTES
written, the question about the first file answered through the proxy's own archive search
(never shown to the agent). With ``auto_previous_response_id`` the SDK sends only what is new:
the proxy continues its own session from its latest response, and refuses any other clearly."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from keeper_middleware.integrations.proxy.sessions.tenants import Tenants
from tests.coding_session import CodingSession
from tests.keeper_stack import (
    RULE,
    Stack,
    audit_session,
    check_upstream_shapes,
    keeper_stack,
    searches_answered,
)

SESSION = CodingSession(files=12, file_bytes=600, per_task=4)
WINDOW = 3072
INSTRUCTIONS = "You are a careful coder."


def shell_in(folder: Path):
    def run_shell(command: str) -> str:
        return subprocess.run(
            command, shell=True, cwd=folder, capture_output=True, text=True, check=False
        ).stdout

    return run_shell


def play(
    stack: Stack,
    folder: Path,
    *,
    streamed: bool,
    chained: bool,
    headers: dict[str, str] | None = None,
) -> tuple[list[str], list[Any]]:
    """The session's prompts, one ``Runner`` run each; returns the final outputs and every
    streamed event the SDK saw, then every request body it sent."""
    from agents import Agent, OpenAIResponsesModel, RunConfig, Runner, function_tool

    sent: list[dict[str, Any]] = []

    async def record(request: httpx.Request) -> None:
        sent.append(json.loads(request.content))

    client = openai.AsyncOpenAI(
        base_url=stack.url,
        api_key="sk-test",
        max_retries=0,
        default_headers=headers,
        http_client=httpx.AsyncClient(event_hooks={"request": [record]}),
    )
    agent = Agent(
        name="coder",
        instructions=INSTRUCTIONS,
        tools=[function_tool(shell_in(folder), name_override="run_shell")],
        model=OpenAIResponsesModel(model="scripted-model", openai_client=client),
    )
    config = RunConfig(tracing_disabled=True)
    seen: list[Any] = []

    async def run() -> list[str]:
        history: list[Any] = []
        previous = None
        finals = []
        for prompt in SESSION.prompts():
            new = [{"role": "user", "content": prompt}]
            given: Any = new if chained else [*history, *new]
            options: dict[str, Any] = {"run_config": config}
            if chained:
                options |= {"auto_previous_response_id": True, "previous_response_id": previous}
            if streamed:
                result: Any = Runner.run_streamed(agent, given, **options)
                async for event in result.stream_events():
                    seen.append(event)
            else:
                result = await Runner.run(agent, given, **options)
            finals.append(result.final_output)
            history = result.to_input_list()
            previous = result.last_response_id
        await client.close()
        return finals

    finals = asyncio.run(run())
    return finals, [*seen, *sent]


@pytest.mark.parametrize("upstream_api", ["responses", "chat", "messages"])
@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
def test_the_agents_sdk_plays_a_session_through_several_cuts(tmp_path, upstream_api, streamed):
    SESSION.write(tmp_path / "work")
    with keeper_stack(SESSION, tmp_path, upstream_api=upstream_api, window=WINDOW) as stack:
        finals, seen = play(stack, tmp_path / "work", streamed=streamed, chained=False)
        assert finals == SESSION.expected_answers()
        (name,) = stack.proxy.sessions()
        counts = audit_session(stack, name)
        assert counts["cuts"] >= 3 and counts["searches"] >= 1
        assert counts["results"] == SESSION.command_count()
        notes = stack.proxy.keeper.notes(name)
        assert RULE in notes.rules and ("part01.txt", "46b9f5964d37") in notes.state
        answered = searches_answered(stack, upstream_api)
        assert any("part01.txt checksum: 46b9f5964d37" in text for text in answered)
        check_upstream_shapes(stack, upstream_api)
    assert "search_archive" not in repr(seen)


def test_previous_response_id_continues_the_proxys_own_session(tmp_path):
    SESSION.write(tmp_path / "work")
    with keeper_stack(SESSION, tmp_path, upstream_api="responses", window=WINDOW) as stack:
        finals, sent = play(stack, tmp_path / "work", streamed=False, chained=True)
        assert finals == SESSION.expected_answers()
        continued = [body for body in sent if body.get("previous_response_id")]
        assert len(continued) >= SESSION.command_count()  # each carried only what was new
        assert all(len(body["input"]) == 1 for body in continued)
        assert len(stack.proxy.sessions()) == 1  # the chain is one session, named by its ids
        (name,) = stack.proxy.sessions()
        assert audit_session(stack, name)["cuts"] >= 3
        upstream = stack.upstream.calls("responses")
        assert not any("previous_response_id" in r.body for r in upstream)
        assert all(r.body["store"] is False for r in upstream)


def test_only_the_latest_response_continues_and_others_are_refused_clearly(tmp_path):
    def ask(client: httpx.Client, given: Any, previous: str | None = None, **extra: Any) -> Any:
        body = {"model": "m", "instructions": INSTRUCTIONS, "input": given,
                "tools": [{"type": "function", "name": "run_shell", "parameters": {}}], **extra}  # fmt: skip
        if previous:
            body["previous_response_id"] = previous
        return client.post("/responses", json=body)

    keys = Tenants({"key-a": "acme", "key-b": "beta"})
    with keeper_stack(
        SESSION, tmp_path, upstream_api="responses", window=WINDOW, tenants=keys
    ) as stack:
        a = httpx.Client(base_url=stack.url, timeout=30, headers={"authorization": "Bearer key-a"})
        b = httpx.Client(base_url=stack.url, timeout=30, headers={"authorization": "Bearer key-b"})
        first = ask(a, SESSION.prompts()[0]).json()
        call = first["output"][-1]
        output = {"type": "function_call_output", "call_id": call["call_id"], "output": "x"}
        second = ask(a, [output], first["id"])
        assert second.status_code == 200, second.text
        again = ask(a, [output], first["id"])  # the first response is no longer the latest
        assert again.status_code == 400
        error = again.json()["error"]
        assert (error["code"], error["param"]) == (
            "previous_response_not_found",
            "previous_response_id",
        )
        assert "continues only from the latest response" in error["message"]
        other = ask(b, [output], second.json()["id"])  # another tenant's id names nothing of b's
        unknown = ask(b, [output], "resp_123")
        assert other.status_code == unknown.status_code == 400
        assert other.json() == unknown.json()  # the same error as an id never given
        unstored = ask(a, SESSION.prompts()[0], store=False).json()
        refused = ask(a, [output], unstored["id"])
        assert refused.status_code == 400 and "store=false" in refused.json()["error"]["message"]
        assert ask(a, [output], "resp_123").json()["error"]["code"] == "previous_response_not_found"
        kept = a.get(f"/responses/{second.json()['id']}")
        assert kept.status_code == 404 and "keeps no responses" in kept.json()["error"]["message"]
        assert b.get(f"{stack.root}/keeper/sessions").json() == {"sessions": []}
        a.close()
        b.close()
