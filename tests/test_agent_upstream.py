"""The scripted agent upstream on its own: its three wire formats parse with the official SDKs'
types, its script survives the cuts a proxy will make, and the Python SDKs people build agents
with (openai-agents' Runner on the Responses API, the anthropic SDK on Messages) finish a tool
using session against it over a real socket."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from tests import api_wire
from tests.agent_upstream import AgentUpstream
from tests.coding_session import (
    SEARCH_TOOL,
    AssistantText,
    CodingSession,
    Reply,
    ToolCall,
    ToolResult,
    Turn,
    UserText,
    checksum,
    next_reply,
)

SESSION = CodingSession(files=4, file_bytes=600, per_task=2)
SHELL = ("run_shell",)


def sse_data(raw: bytes) -> list[dict[str, Any]]:
    events = []
    for line in raw.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            events.append(json.loads(line.removeprefix("data: ")))
    return events


def replies() -> list[Reply]:
    call = ToolCall("call_t0_s01", "run_shell", {"command": "cat part01.txt"})
    return [
        Reply(text="Plain text."),
        Reply(calls=(call,)),
        Reply(reasoning="Think first.", text="Then speak.", calls=(call,)),
    ]


# ----------------------------------------------------------------------------- the wire formats


@pytest.mark.parametrize("reply", replies(), ids=["text", "call", "all"])
def test_responses_wire_parses_with_the_openai_sdk_types(reply):
    body = {"model": "m", "input": "hi", "stream": True}
    events = [data for _, data in api_wire.responses_events(reply, body, 7)]
    adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
    parsed = [adapter.validate_python(event) for event in events]
    assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
    assert parsed[0].type == "response.created" and parsed[-1].type == "response.completed"
    final = Response.model_validate(api_wire.responses_body(reply, body, 7))
    assert (
        final.model_dump(exclude_none=True)["output"]
        == parsed[-1].response.model_dump(exclude_none=True)["output"]
    )
    assert [item.type for item in final.output] == (
        ["reasoning"] * bool(reply.reasoning) + ["message"] * (reply.text is not None)
        + ["function_call"] * len(reply.calls)
    )  # fmt: skip
    done = [e.item.type for e in parsed if e.type == "response.output_item.done"]
    assert done == [item.type for item in final.output]


@pytest.mark.parametrize("reply", replies(), ids=["text", "call", "all"])
def test_messages_wire_parses_with_the_anthropic_sdk_types(reply):
    body = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    events = [data for _, data in api_wire.messages_events(reply, body, 7)]
    adapter: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
    parsed = [adapter.validate_python(e) for e in events if e["type"] != "ping"]
    kinds = [e.type for e in parsed]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop")
    final = Message.model_validate(api_wire.messages_body(reply, body, 7))
    assert final.stop_reason == ("tool_use" if reply.calls else "end_turn")
    assert kinds.count("content_block_start") == len(final.content)


@pytest.mark.parametrize("reply", replies(), ids=["text", "call", "all"])
def test_chat_wire_parses_with_the_openai_sdk_types(reply):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    chunks = [
        ChatCompletionChunk.model_validate(e) for _, e in api_wire.chat_events(reply, body, 7)
    ]
    whole = ChatCompletion.model_validate(api_wire.chat_body(reply, body, 7))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == (whole.choices[0].message.content or "")
    assert chunks[-1].usage is not None


def test_each_api_reads_into_the_same_turn():
    """One conversation written in the three formats reads as one list of items."""
    call_args = {"command": "cat part01.txt"}
    chat = {
        "messages": [
            {"role": "system", "content": "Be careful."},
            {"role": "user", "content": "TASK-1: go"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_t0_s00",
                        "type": "function",
                        "function": {"name": "run_shell", "arguments": json.dumps(call_args)},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_t0_s00", "content": "out"},
        ],
        "tools": [{"type": "function", "function": {"name": "run_shell"}}],
    }
    responses = {
        "instructions": "Be careful.",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "TASK-1: go"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "x"},
            {"type": "function_call", "call_id": "call_t0_s00", "name": "run_shell",
             "arguments": json.dumps(call_args)},
            {"type": "function_call_output", "call_id": "call_t0_s00", "output": "out"},
        ],
        "tools": [{"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "run_shell"}]}],
    }  # fmt: skip
    messages = {
        "system": [{"type": "text", "text": "Be careful."}],
        "messages": [
            {"role": "user", "content": "TASK-1: go"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hm", "signature": "s"},
                {"type": "tool_use", "id": "call_t0_s00", "name": "run_shell", "input": call_args},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_t0_s00",
                 "content": [{"type": "text", "text": "out"}], "cache_control": {"type": "ephemeral"}},
            ]},
        ],
        "tools": [{"name": "run_shell", "input_schema": {"type": "object"}}],
    }  # fmt: skip
    expected = Turn(
        "Be careful.",
        (
            UserText("TASK-1: go"),
            ToolCall("call_t0_s00", "run_shell", call_args),
            ToolResult("call_t0_s00", "out"),
        ),
        SHELL,
    )
    assert api_wire.read_chat(chat) == expected
    assert api_wire.read_responses(responses) == expected
    assert api_wire.read_messages(messages) == expected


# ----------------------------------------------------------------------------- the script


def play_in_memory(session: CodingSession, tools: tuple[str, ...] = SHELL) -> list[Any]:
    """Run the whole session with a perfect client that keeps every turn."""
    items: list[Any] = []
    finals = []
    for prompt in session.prompts():
        items.append(UserText(prompt))
        while True:
            reply = next_reply(session, Turn("", tuple(items), tools))
            if not reply.calls:
                finals.append(reply.text)
                items.append(AssistantText(reply.text or ""))
                break
            for call in reply.calls:
                items.append(call)
                command = call.arguments["command"]
                name = command.split()[-1]
                if command == "ls":
                    output = "\n".join(session.file_names())
                else:
                    output = f"{name} checksum: {checksum(name)}\n..."
                items.append(ToolResult(call.call_id, output))
    return finals


def test_the_session_plays_to_its_expected_answers():
    session = CodingSession(files=6, file_bytes=500, per_task=3)
    assert play_in_memory(session) == session.expected_answers()
    assert session.command_count() == 2 * (1 + 3)
    assert (
        session.expected_answers()[-1]
        == f"QUESTION-1: part01.txt held checksum {checksum('part01.txt').upper()}."
    )


def test_the_next_step_is_read_from_the_last_call_id_so_a_cut_history_still_plays():
    """A proxy keeps the task and the newest exchange; the script continues from there."""
    session = CodingSession(files=6, file_bytes=500, per_task=3)
    cut = Turn(
        "",
        (
            UserText("[NOTES] STATE: reading files"),
            ToolCall("call_t1_s02", "run_shell", {"command": "cat part05.txt"}),
            ToolResult("call_t1_s02", "part05.txt checksum: ..."),
        ),
        SHELL,
    )
    reply = next_reply(session, cut)
    assert reply.calls == (ToolCall("call_t1_s03", "run_shell", {"command": "cat part06.txt"}),)


def test_a_question_about_a_file_out_of_view_searches_the_archive_when_offered():
    session = CodingSession(files=2, file_bytes=200, per_task=2)
    question = Turn("", (UserText(session.prompts()[-1]),), (*SHELL, SEARCH_TOOL))
    reply = next_reply(session, question)
    assert [c.name for c in reply.calls] == [SEARCH_TOOL]
    found = ToolResult(
        reply.calls[0].call_id, f"[item 3] part01.txt checksum: {checksum('part01.txt')}"
    )
    answer = next_reply(session, Turn("", (*question.items, reply.calls[0], found), question.tools))
    assert answer.text == session.expected_answers()[-1]
    unanswered = next_reply(session, Turn("", question.items, SHELL))
    assert unanswered.text == "QUESTION-1: part01.txt is not in what I can see."


# ----------------------------------------------------------------------------- the server


@pytest.fixture
def served():
    upstream = AgentUpstream(SESSION, notes_reply=lambda turn: "STATE: noted")
    with upstream.serving() as url:
        yield upstream, url


def test_note_requests_in_any_api_get_the_notes_reply_and_unplaceable_requests_a_400(served):
    upstream, url = served
    with httpx.Client(base_url=url, timeout=30) as client:
        note = client.post("/messages", json={
            "model": "m", "max_tokens": 64,
            "messages": [{"role": "user", "content": "[NOTES REQUEST] write the changes"}],
        })  # fmt: skip
        assert note.json()["content"] == [{"type": "text", "text": "STATE: noted"}]
        stray = client.post("/responses", json={
            "model": "m", "input": [{"type": "function_call_output", "call_id": "x", "output": "?"}],
        })  # fmt: skip
        assert stray.status_code == 400
        assert "never made: 'x'" in stray.json()["error"]["message"]
        counted = client.post("/messages/count_tokens", json={"model": "m", "messages": []})
        assert counted.json()["input_tokens"] > 0
    assert [r.api for r in upstream.requests] == ["messages", "responses", "count_tokens"]


def shell_in(folder: Path):
    def run_shell(command: str) -> str:
        return subprocess.run(
            command, shell=True, cwd=folder, capture_output=True, text=True, check=False
        ).stdout

    return run_shell


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
def test_openai_agents_runner_finishes_the_session_on_the_responses_api(tmp_path, served, streamed):
    from agents import Agent, OpenAIResponsesModel, RunConfig, Runner, function_tool

    upstream, url = served
    SESSION.write(tmp_path)
    client = openai.AsyncOpenAI(base_url=url, api_key="sk-test", max_retries=0)
    agent = Agent(
        name="coder",
        instructions="You are a careful coder.",
        tools=[function_tool(shell_in(tmp_path), name_override="run_shell")],
        model=OpenAIResponsesModel(model="scripted-model", openai_client=client),
    )
    config = RunConfig(tracing_disabled=True)

    async def play() -> list[str]:
        history: list[Any] = []
        finals = []
        for prompt in SESSION.prompts():
            history = [*history, {"role": "user", "content": prompt}]
            if streamed:
                result: Any = Runner.run_streamed(agent, history, run_config=config)
                async for _ in result.stream_events():
                    pass
            else:
                result = await Runner.run(agent, history, run_config=config)
            finals.append(result.final_output)
            history = result.to_input_list()
        await client.close()
        return finals

    assert asyncio.run(play()) == SESSION.expected_answers()
    calls = upstream.calls("responses")
    assert {bool(r.body.get("stream")) for r in calls} == {streamed}
    assert len(upstream.tool_results("responses")) == SESSION.command_count()
    assert all(r.body["instructions"] == "You are a careful coder." for r in calls)


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
def test_anthropic_sdk_tool_loop_finishes_the_session_on_the_messages_api(
    tmp_path, served, streamed
):
    upstream, url = served
    SESSION.write(tmp_path)
    run_shell = shell_in(tmp_path)
    client = anthropic.Anthropic(base_url=url.removesuffix("/v1"), api_key="sk-test", max_retries=0)
    tools: Any = [
        {
            "name": "run_shell",
            "description": "Run a shell command in the workspace.",
            "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
        }
    ]
    messages: list[Any] = []
    finals = []
    for prompt in SESSION.prompts():
        messages.append({"role": "user", "content": prompt})
        while True:
            options: Any = {
                "model": "m",
                "max_tokens": 1024,
                "system": "Be careful.",
                "tools": tools,
            }
            if streamed:
                with client.messages.stream(messages=messages, **options) as stream:
                    reply = stream.get_final_message()
            else:
                reply = client.messages.create(messages=messages, **options)
            messages.append(
                {"role": "assistant", "content": [b.model_dump() for b in reply.content]}
            )
            uses = [b for b in reply.content if b.type == "tool_use"]
            if not uses:
                finals.append("".join(b.text for b in reply.content if b.type == "text"))
                break
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": u.id,
                            "content": run_shell(**u.input),
                        }
                        for u in uses
                    ],
                }
            )
    assert finals == SESSION.expected_answers()
    assert len(upstream.tool_results("messages")) == SESSION.command_count()
    assert {bool(r.body.get("stream")) for r in upstream.calls("messages")} == {streamed}
