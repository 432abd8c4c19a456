"""The Responses and Messages front doors over a real socket, in front of the scripted upstream
speaking each API: every event and body the official SDKs' types accept, the archive search
answered by the proxy and never shown, sessions, tenants, errors in each API's own shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from tests.coding_session import CodingSession, checksum
from tests.keeper_stack import Stack, keeper_stack, mentions_search

SESSION = CodingSession(files=6, file_bytes=600, per_task=6)
SHELL_RESPONSES = [{"type": "function", "name": "run_shell", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}}}]  # fmt: skip
SHELL_MESSAGES = [{"name": "run_shell", "input_schema": {
    "type": "object", "properties": {"command": {"type": "string"}}}}]  # fmt: skip
PROMPT = SESSION.prompts()[0]
LAST = "call_t0_s06"  # the session's seventh and last command of its first task


def events(raw: str) -> list[tuple[str | None, dict[str, Any]]]:
    """(event name, data) of each server-sent event."""
    out: list[tuple[str | None, dict[str, Any]]] = []
    name = None
    for line in raw.splitlines():
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            out.append((name, json.loads(line.removeprefix("data: "))))
            name = None
    return out


def responses_body(history: list[Any], stream: bool) -> dict[str, Any]:
    return {"model": "m", "instructions": "Be careful.", "input": history,
            "tools": SHELL_RESPONSES, "stream": stream}  # fmt: skip


def messages_body(history: list[Any], stream: bool) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 512, "system": "Be careful.", "messages": history,
            "tools": SHELL_MESSAGES, "stream": stream}  # fmt: skip


def last_step(front: str) -> list[Any]:
    """A history whose next reply is the task's final text."""
    arguments = {"command": "cat part06.txt"}
    output = f"part06.txt checksum: {checksum('part06.txt')}\n"
    if front == "responses":
        return [
            {"role": "user", "content": PROMPT},
            {"type": "function_call", "call_id": LAST, "name": "run_shell",
             "arguments": json.dumps(arguments)},
            {"type": "function_call_output", "call_id": LAST, "output": output},
        ]  # fmt: skip
    return [
        {"role": "user", "content": PROMPT},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": LAST, "name": "run_shell", "input": arguments}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": LAST, "content": output}]},
    ]  # fmt: skip


@pytest.fixture(params=["chat", "responses", "messages"])
def stack(request, tmp_path) -> Iterator[Stack]:
    with keeper_stack(SESSION, tmp_path, upstream_api=request.param, window=32_768) as served:
        yield served


RESPONSE_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
MESSAGE_EVENT: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)


@pytest.mark.parametrize("history", ["first", "last"])
def test_a_responses_stream_is_events_the_openai_sdk_reads(stack, history):
    sent = [{"role": "user", "content": PROMPT}] if history == "first" else last_step("responses")
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        got = client.post("/responses", json=responses_body(sent, True))
        plain = client.post("/responses", json=responses_body(sent, False))
    assert got.status_code == 200, got.text
    stream = events(got.text)
    parsed = [RESPONSE_EVENT.validate_python(data) for _, data in stream]
    assert all(name == data["type"] for name, data in stream)
    assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
    assert parsed[0].type == "response.created" and parsed[-1].type == "response.completed"
    final = parsed[-1].response
    added = [e.output_index for e in parsed if e.type == "response.output_item.added"]
    done = [e.item for e in parsed if e.type == "response.output_item.done"]
    assert added == list(range(len(final.output)))
    assert [d.model_dump() for d in done] == [o.model_dump() for o in final.output]
    assert parsed[0].response.id == final.id
    whole = Response.model_validate(plain.json())
    assert [o.type for o in whole.output] == [o.type for o in final.output]
    if history == "first":
        call = next(o for o in final.output if o.type == "function_call")
        assert (call.name, json.loads(call.arguments)) == ("run_shell", {"command": "ls"})
    else:
        assert final.output_text == whole.output_text == SESSION.expected_answers()[0]
    assert final.usage is not None and final.usage.input_tokens > 0
    assert not mentions_search(plain.json()) and not mentions_search(stream)


@pytest.mark.parametrize("history", ["first", "last"])
def test_a_messages_stream_is_events_the_anthropic_sdk_reads(stack, history):
    sent = [{"role": "user", "content": PROMPT}] if history == "first" else last_step("messages")
    with httpx.Client(base_url=stack.root, timeout=30) as client:
        got = client.post("/v1/messages?beta=true", json=messages_body(sent, True))
        plain = client.post("/v1/messages", json=messages_body(sent, False))
    assert got.status_code == 200, got.text
    stream = [(name, data) for name, data in events(got.text) if data["type"] != "ping"]
    parsed = [MESSAGE_EVENT.validate_python(data) for _, data in stream]
    kinds = [e.type for e in parsed]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    starts = [e.index for e in parsed if e.type == "content_block_start"]
    stops = [e.index for e in parsed if e.type == "content_block_stop"]
    assert starts == stops == list(range(len(starts)))
    whole = Message.model_validate(plain.json())
    assert len(starts) == len(whole.content)
    thinking = [b for b in whole.content if b.type == "thinking"]
    if stack.upstream.calls("messages"):  # the upstream's own signed thinking, passed through
        assert all(b.signature.startswith("sig-") for b in thinking)
    else:  # reasoning from another API has no signature: not shown
        assert thinking == []
    if history == "first":
        assert whole.stop_reason == "tool_use"
    else:
        assert whole.stop_reason == "end_turn"
        assert whole.content[-1].text == SESSION.expected_answers()[0]
    assert not mentions_search(plain.json()) and not mentions_search(stream)


def test_the_sdks_read_both_doors(stack):
    """The official clients, plain and streamed, against either door and any upstream."""
    client = openai.OpenAI(base_url=stack.url, api_key="k", max_retries=0)
    sent = last_step("responses")
    assert (
        client.responses.create(**responses_body(sent, False)).output_text
        == (SESSION.expected_answers()[0])
    )
    with client.responses.stream(**{k: v for k, v in responses_body(sent, False).items()
                                    if k != "stream"}) as streaming:  # fmt: skip
        assert streaming.get_final_response().output_text == SESSION.expected_answers()[0]
    claude = anthropic.Anthropic(base_url=stack.root, api_key="k", max_retries=0)
    body = {k: v for k, v in messages_body(last_step("messages"), False).items() if k != "stream"}
    with claude.messages.stream(**body) as streaming:
        final = streaming.get_final_message()
    assert final.content[-1].text == SESSION.expected_answers()[0]
    assert claude.messages.create(**body).content[-1].text == SESSION.expected_answers()[0]
    chat = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": PROMPT}],
        tools=[
            {
                "type": "function",
                "function": {"name": "run_shell", "parameters": SHELL_MESSAGES[0]["input_schema"]},
            }
        ],
    )  # fmt: skip  (the chat door, translated to whatever the upstream speaks)
    calls = chat.choices[0].message.tool_calls or []
    assert [c.function.name for c in calls] == ["run_shell"]


def test_the_same_api_upstream_gets_reasoning_and_signatures_back_verbatim(tmp_path):
    """A reasoning item's encrypted content and a thinking block's signature, sent to the
    client, come back from the proxy's own window on the next call, unchanged."""
    for api, path, first in (("responses", "/responses", responses_body),
                             ("messages", "/messages", messages_body)):  # fmt: skip
        with keeper_stack(SESSION, tmp_path / api, upstream_api=api, window=32_768) as stack:
            with httpx.Client(base_url=stack.url, timeout=30) as client:
                history: list[Any] = [{"role": "user", "content": PROMPT}]
                reply = client.post(path, json=first(history, False)).json()
                if api == "responses":
                    output = reply["output"]
                    history += [*output, {"type": "function_call_output",
                                          "call_id": output[-1]["call_id"], "output": "a\nb"}]  # fmt: skip
                else:
                    call = reply["content"][-1]["id"]
                    history += [{"role": "assistant", "content": reply["content"]},
                                {"role": "user", "content": [{"type": "tool_result",
                                 "tool_use_id": call, "content": "a\nb"}]}]  # fmt: skip
                assert client.post(path, json=first(history, False)).status_code == 200
            second = json.dumps(stack.upstream.calls(api)[1].body)
            if api == "responses":
                assert '"encrypted_content": "opaque-reasoning-1"' in second
            else:
                assert '"signature": "sig-1"' in second
