"""The simulated reader served as an OpenAI-compatible endpoint.

The proxy and any OpenAI-compatible agent talk HTTP, so the reader has to as well: this lets the
benchmark run those arms end to end, in seconds, with the same answers as in-process. Like a real
server it reports usage, and `cached_tokens` from a simple exact prefix cache (the common prefix
with the previous request it served), which is what shows whether requests reuse the prefix.

It is not a language model: the model it reports is "simulated-reader".

    python -m keeper_bench.reader.server --port 8200
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import uvicorn
from langchain_core.messages import BaseMessage, convert_to_messages
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from keeper_bench.reader.faults import ReaderFaults
from keeper_bench.reader.model import (
    DEFAULT_SUMMARY_TOKENS,
    MODEL_NAME,
    Reply,
    SimulatedReader,
    approx_tokens,
    call_id,
    reader_reply,
    reply_tokens,
    request_tokens,
)
from keeper_bench.reader.rot import ContextRot
from keeper_middleware.integrations.proxy.cli import serve_in_thread
from keeper_middleware.messages.facts import text_of

_ROLES = {"system", "developer", "user", "assistant", "tool"}
_CHUNK_CHARS = 24


class BadRequestError(ValueError):
    """A request the server cannot read; answered with HTTP 400 in OpenAI's error shape."""


def _error(message: str, status: int = 400, param: str | None = None) -> JSONResponse:
    body = {
        "error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}
    }
    return JSONResponse(body, status_code=status)


def parse_messages(raw: Any) -> list[BaseMessage]:
    """OpenAI chat messages as LangChain messages (assistant ``content: null`` allowed)."""
    if not isinstance(raw, list) or not raw:
        raise BadRequestError("'messages' must be a non-empty list of {role, content} objects.")
    cleaned: list[dict[str, Any]] = []
    for position, message in enumerate(raw):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise BadRequestError(f"messages[{position}] needs a 'role' among {sorted(_ROLES)}.")
        entry = dict(message)
        if entry["role"] == "developer":
            entry["role"] = "system"
        content = entry.get("content")
        if content is None:
            entry["content"] = ""
        elif not isinstance(content, str | list):
            raise BadRequestError(
                f"messages[{position}].content must be a string, a list of parts or null."
            )
        if entry["role"] == "tool" and not isinstance(entry.get("tool_call_id"), str):
            raise BadRequestError(
                f"messages[{position}] is a tool message without a 'tool_call_id'."
            )
        cleaned.append(entry)
    try:
        return list(convert_to_messages(cleaned))
    except (ValueError, TypeError, KeyError, json.JSONDecodeError) as exc:
        raise BadRequestError(f"'messages' could not be read: {exc}") from exc


def tool_names(raw: Any) -> frozenset[str]:
    if raw is None:
        return frozenset()
    if not isinstance(raw, list):
        raise BadRequestError(
            "'tools' must be a list of {type: 'function', function: {name}} objects."
        )
    names: set[str] = set()
    for position, tool in enumerate(raw):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise BadRequestError(f"tools[{position}] needs function.name.")
        names.add(function["name"])
    return frozenset(names)


def call_kwargs(body: dict[str, Any]) -> dict[str, Any]:
    """The request fields the reader looks at, in the shape ChatOpenAI passes them in-process."""
    kwargs: dict[str, Any] = {}
    for key in ("temperature", "reasoning_effort", "max_tokens", "max_completion_tokens"):
        if body.get(key) is not None:
            kwargs[key] = body[key]
    if isinstance(body.get("chat_template_kwargs"), dict):
        kwargs["extra_body"] = {"chat_template_kwargs": body["chat_template_kwargs"]}
    return kwargs


def rendered_prompt(messages: Sequence[BaseMessage]) -> str:
    """The request as one text, the way a chat template lays it out, for prefix matching."""
    parts = []
    for message in messages:
        calls = getattr(message, "tool_calls", None) or []
        call_text = (
            json.dumps([[c["name"], c["args"]] for c in calls], sort_keys=True) if calls else ""
        )
        parts.append(f"<|{message.type}|>{text_of(message)}{call_text}<|end|>\n")
    return "".join(parts)


class PrefixCache:
    """An exact prefix cache of one entry: the previous prompt served."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._previous = ""

    def cached_tokens(self, prompt: str) -> int:
        with self._lock:
            previous, self._previous = self._previous, prompt
        common = 0
        for mine, theirs in zip(prompt, previous, strict=False):
            if mine != theirs:
                break
            common += 1
        return common // 4


def _usage(prompt_tokens: int, cached: int, reply: Reply, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": min(cached, prompt_tokens)},
        "completion_tokens_details": {"reasoning_tokens": approx_tokens(reply.reasoning)},
    }


def _openai_tool_calls(reply: Reply, digest: str) -> list[dict[str, Any]]:
    return [
        {
            "id": call_id(digest, index),
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)},
        }
        for index, (name, args) in enumerate(reply.tool_calls)
    ]


def _completion(reply: Reply, digest: str, usage: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["content"] = reply.content or None
        message["tool_calls"] = _openai_tool_calls(reply, digest)
    if reply.reasoning:
        message["reasoning_content"] = reply.reasoning
    return {
        "id": f"chatcmpl-{digest[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": MODEL_NAME,
        "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason}],
        "usage": usage,
    }


def _chunks(reply: Reply, digest: str, usage: dict[str, Any] | None) -> Iterator[dict[str, Any]]:
    base = {
        "id": f"chatcmpl-{digest[:24]}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": MODEL_NAME,
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    yield chunk({"role": "assistant", "content": ""})
    if reply.reasoning:
        yield chunk({"reasoning_content": reply.reasoning})
    for start in range(0, len(reply.content), _CHUNK_CHARS):
        yield chunk({"content": reply.content[start : start + _CHUNK_CHARS]})
    for index, call in enumerate(_openai_tool_calls(reply, digest)):
        yield chunk({"tool_calls": [{"index": index, **call}]})
    yield chunk({}, reply.finish_reason)
    if usage is not None:
        yield {**base, "choices": [], "usage": usage}


def create_reader_app(reader: SimulatedReader | None = None) -> Starlette:
    """The HTTP app: /v1/chat/completions, /v1/models and /tokenize, serving ``reader``."""
    served = reader if reader is not None else SimulatedReader()
    faults: ReaderFaults = served.faults
    cache = PrefixCache()

    async def chat_completions(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _error(f"The request body is not JSON: {exc}. Send a JSON object.")
        if not isinstance(body, dict):
            return _error("The request body must be a JSON object.")
        try:
            messages = parse_messages(body.get("messages"))
            tools = tool_names(body.get("tools"))
        except BadRequestError as exc:
            return _error(str(exc))
        kwargs = call_kwargs(body)
        reply, digest = reader_reply(
            messages,
            tools=tools,
            faults=faults,
            call_kwargs=kwargs,
            rot=served.rot,
            summary_tokens=served.summary_tokens,
        )
        prompt_tokens = request_tokens(messages)
        usage = _usage(
            prompt_tokens,
            cache.cached_tokens(rendered_prompt(messages)),
            reply,
            reply_tokens(reply),
        )
        if not body.get("stream"):
            return JSONResponse(_completion(reply, digest, usage))
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))

        async def events() -> AsyncIterator[str]:
            for item in _chunks(reply, digest, usage if include_usage else None):
                yield f"data: {json.dumps(item)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def models(request: Request) -> Response:
        entry = {"id": MODEL_NAME, "object": "model", "created": 0, "owned_by": "keeper-middleware"}
        return JSONResponse({"object": "list", "data": [entry]})

    async def tokenize(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("content"), str):
            return _error('/tokenize takes {"content": "<text>"}.', param="content")
        text = body["content"]
        tokens = [sum(text[i : i + 4].encode()) for i in range(0, len(text), 4)]
        return JSONResponse({"tokens": tokens})

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/tokenize", tokenize, methods=["POST"]),
        ]
    )


@contextmanager
def serve_reader(
    reader: SimulatedReader | None = None, host: str = "127.0.0.1", port: int = 0
) -> Iterator[str]:
    """Run the reader's server in a background thread; yields its base URL (ending in /v1).

    Port 0 picks a free port. The server is shut down when the block ends.
    """
    with serve_in_thread(create_reader_app(reader), host=host, port=port, lifespan="off") as url:
        yield url


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Serve the simulated reader (not a language model) as an OpenAI-compatible endpoint."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8200)
    parser.add_argument("--seed", type=int, default=0, help="seed that decides the faults")
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="NAME=RATE",
        help="switch a fault on, e.g. --fault misread=0.05 (repeatable)",
    )
    parser.add_argument(
        "--rot",
        type=float,
        default=0.0,
        help="context rot: the chance of overlooking a sentence 100K tokens back (0 off)",
    )
    parser.add_argument(
        "--summary-tokens",
        type=int,
        default=DEFAULT_SUMMARY_TOKENS,
        help="a summary's budget when the request states none",
    )
    args = parser.parse_args(argv)
    rates: dict[str, float] = {}
    for spec in args.fault:
        name, _, rate = spec.partition("=")
        try:
            rates[name.strip()] = float(rate)
        except ValueError:
            parser.error(f"--fault takes NAME=RATE with RATE between 0 and 1, got {spec!r}")
    try:
        faults = ReaderFaults(seed=args.seed, **rates)  # type: ignore[arg-type]
    except TypeError as exc:
        parser.error(f"unknown fault in {args.fault!r}: {exc}")
    try:
        rot = ContextRot(rate=args.rot, seed=args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    reader = SimulatedReader(faults=faults, rot=rot, summary_tokens=args.summary_tokens)
    uvicorn.run(create_reader_app(reader), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
