"""A thin compatibility layer in front of the llama-cpp-python OpenAI server.

The stock server (llama-cpp-python 0.3.36) differs from what the OpenAI SDK and LangChain send and
expect, in ways measured against it:

- an assistant message with ``content: null`` (how both clients send a tool call back) is rejected
  with HTTP 500, so a tool round trip fails;
- ``max_completion_tokens`` (what ``ChatOpenAI(max_tokens=...)`` sends) is ignored, so a reply runs
  to the end of the context;
- ``tool_choice="required"`` (LangChain's ``"any"``) is not enforced; with one tool it means that
  tool, which the server does enforce when named;
- streams carry no usage, even when ``stream_options.include_usage`` asks for it;
- usage never says how much of the prompt came from the prefix cache.

This module fixes those at the HTTP edge: the request rewrite is a pure function, and the prefix
reuse is read from the model object itself (how many prompt tokens it actually evaluated), so the
numbers are the server's own. Run it as::

    python -m keeper_middleware.integrations.llama_compat --model FILE.gguf --n_ctx 8192 --port 8011
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import json
import socket
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

CHAT_PATH = "/v1/chat/completions"


# --- pure request and response rewrites -------------------------------------------------------


def adapt_chat_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """Returns a copy of an OpenAI chat request that the llama-cpp-python server accepts and honours."""
    adapted = {key: value for key, value in body.items() if key != "stream_options"}
    adapted["messages"] = [_adapt_message(message) for message in body.get("messages", [])]
    if "max_completion_tokens" in adapted:
        limit = adapted.pop("max_completion_tokens")
        if adapted.get("max_tokens") is None:
            adapted["max_tokens"] = limit
    tools = body.get("tools") or []
    if body.get("tool_choice") in ("required", "any") and len(tools) == 1:
        name = tools[0]["function"]["name"]
        adapted["tool_choice"] = {"type": "function", "function": {"name": name}}
    return adapted


def _adapt_message(message: Any) -> Any:
    is_assistant = isinstance(message, Mapping) and message.get("role") == "assistant"
    if is_assistant and message.get("content") is None:
        return {**message, "content": ""}
    return message


def wants_stream_usage(body: Mapping[str, Any]) -> bool:
    options = body.get("stream_options")
    return (
        bool(body.get("stream"))
        and isinstance(options, Mapping)
        and bool(options.get("include_usage"))
    )


@dataclass(slots=True)
class PromptEvaluation:
    """What the model did for one completion: prompt size, tokens it evaluated, tokens it sampled."""

    prompt_tokens: int = 0
    evaluated_tokens: int | None = None
    completion_tokens: int = 0

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens served from the KV cache: the prompt minus what had to be evaluated."""
        if self.evaluated_tokens is None:
            return 0
        return max(self.prompt_tokens - self.evaluated_tokens, 0)


def usage_with_cached_tokens(usage: Mapping[str, Any], cached_tokens: int) -> dict[str, Any]:
    details = dict(usage.get("prompt_tokens_details") or {})
    details["cached_tokens"] = cached_tokens
    return {**usage, "prompt_tokens_details": details}


def usage_from_evaluation(evaluation: PromptEvaluation) -> dict[str, Any]:
    return {
        "prompt_tokens": evaluation.prompt_tokens,
        "completion_tokens": evaluation.completion_tokens,
        "total_tokens": evaluation.prompt_tokens + evaluation.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": evaluation.cached_tokens},
    }


def usage_chunk(last_chunk: Mapping[str, Any], usage: Mapping[str, Any]) -> dict[str, Any]:
    """The final stream chunk OpenAI sends when ``include_usage`` is set: no choices, only usage."""
    return {
        "id": last_chunk.get("id", ""),
        "object": "chat.completion.chunk",
        "created": last_chunk.get("created", 0),
        "model": last_chunk.get("model", ""),
        "choices": [],
        "usage": dict(usage),
    }


# --- measuring the model -------------------------------------------------------------------------

_current_evaluation: contextvars.ContextVar[PromptEvaluation | None] = contextvars.ContextVar(
    "keeper_llama_evaluation", default=None
)


def instrument_llama(llama: Any) -> None:
    """Wraps the model's ``generate`` and ``eval`` so each request learns its prompt reuse.

    llama-cpp-python decides the prefix reuse inside ``generate`` (and may first load a state from
    its RAM cache); the first ``eval`` of a generation receives exactly the prompt tokens that were
    not reused, so prompt length minus that batch is the reuse, whatever path led there.
    """
    original_generate: Callable[..., Iterator[int]] = llama.generate
    original_eval: Callable[[Sequence[int]], None] = llama.eval
    is_end_of_generation: Callable[[int], bool] = _end_of_generation_test(llama)

    def generate(tokens: Sequence[int], *args: Any, **kwargs: Any) -> Iterator[int]:
        evaluation = _current_evaluation.get()
        if evaluation is not None:
            evaluation.prompt_tokens = len(tokens)
            evaluation.evaluated_tokens = None
            evaluation.completion_tokens = 0
        for token in original_generate(tokens, *args, **kwargs):
            if evaluation is not None and not is_end_of_generation(token):
                evaluation.completion_tokens += 1
            yield token

    def evaluate(tokens: Sequence[int]) -> None:
        evaluation = _current_evaluation.get()
        if evaluation is not None and evaluation.evaluated_tokens is None:
            evaluation.evaluated_tokens = len(tokens)
        original_eval(tokens)

    setattr(llama, "generate", generate)  # noqa: B010 (an instance attribute on purpose)
    setattr(llama, "eval", evaluate)  # noqa: B010


def _end_of_generation_test(llama: Any) -> Callable[[int], bool]:
    import llama_cpp

    vocab = llama._model.vocab
    return lambda token: bool(llama_cpp.llama_vocab_is_eog(vocab, token))


# --- the ASGI layer ------------------------------------------------------------------------------


class CompatibilityMiddleware:
    """Rewrites chat requests on the way in and completes usage on the way out."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != CHAT_PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        raw = await _read_body(receive)
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            await self.app(scope, _replay(raw, receive), send)
            return
        evaluation = PromptEvaluation()
        token = _current_evaluation.set(evaluation)
        try:
            adapted = json.dumps(adapt_chat_request(body)).encode()
            scope = {**scope, "headers": _with_content_length(scope["headers"], len(adapted))}
            rewriter = _ResponseRewriter(send, evaluation, stream_usage=wants_stream_usage(body))
            await self.app(scope, _replay(adapted, receive), rewriter.send)
        finally:
            _current_evaluation.reset(token)


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """Hands the app the (rewritten) body, then the client's own messages (its disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def _with_content_length(headers: Sequence[tuple[bytes, bytes]], length: int) -> list[Any]:
    kept = [(key, value) for key, value in headers if key.lower() != b"content-length"]
    return [*kept, (b"content-length", str(length).encode())]


class _ResponseRewriter:
    """Adds ``cached_tokens`` to JSON replies, and a usage chunk before a stream's ``[DONE]``."""

    def __init__(self, send: Send, evaluation: PromptEvaluation, *, stream_usage: bool) -> None:
        self._send = send
        self._evaluation = evaluation
        self._stream_usage = stream_usage
        self._start: Message | None = None
        self._json_parts: list[bytes] = []
        self._last_chunk: dict[str, Any] = {}

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            content_type = dict(message.get("headers", [])).get(b"content-type", b"")
            if message["status"] == 200 and content_type.startswith(b"application/json"):
                self._start = message  # held until the body is complete and rewritten
                return
            await self._send(message)
        elif message["type"] == "http.response.body" and self._start is not None:
            self._json_parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                await self._send_rewritten_json(self._start)
        elif message["type"] == "http.response.body":
            await self._send({**message, "body": self._rewrite_events(message.get("body", b""))})
        else:
            await self._send(message)

    async def _send_rewritten_json(self, start: Message) -> None:
        body = b"".join(self._json_parts)
        try:
            reply = json.loads(body)
        except ValueError:
            reply = None
        if isinstance(reply, dict) and isinstance(reply.get("usage"), dict):
            reply["usage"] = usage_with_cached_tokens(
                reply["usage"], self._evaluation.cached_tokens
            )
            body = json.dumps(reply).encode()
        headers = _with_content_length(start.get("headers", []), len(body))
        await self._send({**start, "headers": headers})
        await self._send({"type": "http.response.body", "body": body, "more_body": False})

    def _rewrite_events(self, body: bytes) -> bytes:
        """Server-sent events: remember the last chunk, and put the usage chunk before [DONE]."""
        out: list[bytes] = []
        for line in body.splitlines(keepends=True):
            payload = line.strip()
            if payload.startswith(b"data:"):
                data = payload[len(b"data:") :].strip()
                if data == b"[DONE]" and self._stream_usage:
                    chunk = usage_chunk(self._last_chunk, usage_from_evaluation(self._evaluation))
                    out.append(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                elif data.startswith(b"{"):
                    with contextlib.suppress(ValueError):
                        self._last_chunk = json.loads(data)
            out.append(line)
        return b"".join(out)


# --- building and running the server -------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class CompatServerSettings:
    """How to run the model; the defaults are the measured fast settings for a 2-core CPU."""

    model: str
    """Path to the GGUF file."""
    model_alias: str
    """The model name clients send and ``/v1/models`` lists."""
    n_ctx: int = 8192
    n_threads: int = 2
    ram_cache: bool = False
    """Keep earlier prompts' states in RAM, so switching between conversations also hits."""
    verbose: bool = False

    def __post_init__(self) -> None:
        if self.n_ctx < 16:
            raise ValueError(f"n_ctx={self.n_ctx} is too small; pass the context size, e.g. 8192")
        if self.n_threads < 1:
            raise ValueError(f"n_threads={self.n_threads} must be at least 1")


def create_compat_app(settings: CompatServerSettings) -> ASGIApp:
    """Builds the stock llama-cpp-python app, instruments its model and wraps it in the shim."""
    from llama_cpp.server import app as server_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    model_settings = ModelSettings(
        model=settings.model,
        model_alias=settings.model_alias,
        n_ctx=settings.n_ctx,
        n_threads=settings.n_threads,
        n_threads_batch=settings.n_threads,
        logits_all=False,  # the default True stores full-vocab logits per prompt token: slow, GBs
        flash_attn=True,
        cache=settings.ram_cache,
        verbose=settings.verbose,
    )
    app = server_app.create_app(
        server_settings=ServerSettings(host="127.0.0.1", port=0),
        model_settings=[model_settings],
    )
    proxy = server_app._llama_proxy
    if proxy is None:
        raise RuntimeError("llama-cpp-python created no model; check the model path and settings")
    instrument_llama(proxy(settings.model_alias))
    return CompatibilityMiddleware(app)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Serve a GGUF model through llama-cpp-python with OpenAI-client fixes."
    )
    parser.add_argument("--model", required=True, help="path to the GGUF file")
    parser.add_argument("--model_alias", default=None, help="model name (default: file stem)")
    parser.add_argument("--n_ctx", type=int, default=8192)
    parser.add_argument("--n_threads", type=int, default=2)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--ram_cache", action="store_true", help="keep several prompts cached")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)

    import uvicorn

    alias = args.model_alias or _file_stem(args.model)
    settings = CompatServerSettings(
        model=args.model,
        model_alias=alias,
        n_ctx=args.n_ctx,
        n_threads=args.n_threads,
        ram_cache=args.ram_cache,
        verbose=args.verbose,
    )
    app = create_compat_app(settings)
    listener = socket.create_server((args.host, args.port))
    print(f"serving {alias} on http://{args.host}:{listener.getsockname()[1]}/v1", flush=True)
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=3)
    uvicorn.Server(config).run(sockets=[listener])


def _file_stem(path: str) -> str:
    name = path.replace("\\", "/").rsplit("/", 1)[-1]
    return name[: -len(".gguf")] if name.lower().endswith(".gguf") else name


if __name__ == "__main__":
    main(sys.argv[1:])
