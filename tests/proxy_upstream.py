"""The keeper proxy in-process, as the proxy suites drive it: httpx.ASGITransport to the app,
the upstream an httpx.MockTransport.

``ScriptedUpstream`` is an OpenAI-compatible model server in a few lines: it records every request
body, answers note requests with change lines, and otherwise plays a script of replies (text, tool
calls, errors) or a default answer. ``run_items`` feeds a session numbered story items until the
keeper cuts. A suite takes the ``upstream`` and ``proxy`` fixtures by importing
``upstream_fixture`` and ``proxy_fixture``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from keeper_middleware.integrations.proxy import RetryPolicy, create_proxy_app

SYSTEM = "You are a careful clerk."
AGENT_TOOL = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
}


# ----------------------------------------------------------------------------- the fake upstream


def completion(
    message: dict[str, Any], *, finish: str = "stop", prompt: int = 100, cached: int = 0
) -> dict[str, Any]:
    return {
        "id": "chatcmpl-up",
        "object": "chat.completion",
        "created": 1,
        "model": "upstream-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": 5,
            "total_tokens": prompt + 5,
            "prompt_tokens_details": {"cached_tokens": cached},
        },
    }


def text_reply(text: str, **extra: Any) -> dict[str, Any]:
    return completion({"role": "assistant", "content": text, **extra})


def tool_reply(*calls: tuple[str, str, dict[str, Any]], text: str | None = None) -> dict[str, Any]:
    return completion(
        {
            "role": "assistant",
            "content": text,
            "tool_calls": [
                {
                    "id": cid,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)},
                }
                for cid, name, args in calls
            ],
        },
        finish="tool_calls",
    )


def last_text(body: dict[str, Any]) -> str:
    content = body["messages"][-1].get("content") or ""
    return content if isinstance(content, str) else json.dumps(content)


def is_note_call(body: dict[str, Any]) -> bool:
    return last_text(body).startswith(("[NOTES REQUEST]", "[NOTES CHECK]"))


def as_sse(data: dict[str, Any]) -> bytes:
    """A completion as an OpenAI server would stream it: text in pieces, then tool calls."""
    choice = data["choices"][0]
    message = choice["message"]
    envelope = {k: data[k] for k in ("id", "model", "created") if k in data}

    def event(delta: dict[str, Any], reason: str | None = None) -> str:
        payload = {**envelope, "choices": [{"index": 0, "delta": delta, "finish_reason": reason}]}
        return f"data: {json.dumps(payload)}\n\n"

    out = [event({"role": "assistant", "content": ""})]
    for key in ("reasoning_content", "content"):
        text = message.get(key) or ""
        out += [event({key: text[i : i + 5]}) for i in range(0, len(text), 5)]
    for index, call in enumerate(message.get("tool_calls") or []):
        args = call["function"]["arguments"]
        head = {"index": index, "id": call["id"], "type": "function"}
        out.append(
            event({"tool_calls": [{**head, "function": {"name": call["function"]["name"]}}]})
        )
        out += [
            event({"tool_calls": [{"index": index, "function": {"arguments": args[i : i + 7]}}]})
            for i in range(0, len(args), 7)
        ]
    out.append(event({}, choice.get("finish_reason") or "stop"))
    if "usage" in data:
        out.append(f"data: {json.dumps({**envelope, 'choices': [], 'usage': data['usage']})}\n\n")
    out.append("data: [DONE]\n\n")
    return "".join(out).encode()


@dataclass
class ScriptedUpstream:
    """Script entries: a completion dict, an ``httpx.Response``, an exception to raise, or a
    callable ``(body) -> any of those``. When the script is empty, ``default(body)`` answers."""

    script: list[Any] = field(default_factory=list)
    notes_reply: Callable[[dict[str, Any]], str] = lambda body: "NO CHANGES"
    default: Callable[[dict[str, Any]], Any] = lambda body: text_reply(
        "ok: " + last_text(body)[:40]
    )
    requests: list[dict[str, Any]] = field(default_factory=list)

    @property
    def work_calls(self) -> list[dict[str, Any]]:
        return [b for b in self.requests if not is_note_call(b)]

    @property
    def note_calls(self) -> list[dict[str, Any]]:
        return [b for b in self.requests if is_note_call(b)]

    def answer(self, body: dict[str, Any]) -> httpx.Response:
        self.requests.append(body)
        if is_note_call(body):
            entry: Any = text_reply(self.notes_reply(body))
        else:
            entry = self.script.pop(0) if self.script else self.default
            if callable(entry):
                entry = entry(body)
        if isinstance(entry, BaseException):
            raise entry
        if isinstance(entry, httpx.Response):
            return entry
        if body.get("stream"):
            return httpx.Response(
                200, content=as_sse(entry), headers={"content-type": "text/event-stream"}
            )
        return httpx.Response(200, json=entry)

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"object": "list", "data": [{"id": "upstream-model"}]})
        return self.answer(json.loads(request.content))

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)


FAST_RETRY = RetryPolicy(attempts=3, first_wait=0.0, max_wait=0.0, budget=5.0, timeout=5.0)


def make_app(upstream: ScriptedUpstream, folder: Path, **options: Any) -> Any:
    options.setdefault("window", 32_768)
    options.setdefault("retry", FAST_RETRY)
    return create_proxy_app(
        "http://upstream.test/v1", archive_dir=folder, transport=upstream.transport(), **options
    )


def client_for(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy.test")


def chat(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "agent-model", "messages": messages, **extra}


def convo(*turns: str) -> list[dict[str, Any]]:
    """System, then user/assistant alternating, starting with the user."""
    roles = ("user", "assistant")
    return [{"role": "system", "content": SYSTEM}] + [
        {"role": roles[i % 2], "content": t} for i, t in enumerate(turns)
    ]


def sse_payloads(text: str) -> list[Any]:
    events = [
        line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")
    ]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


@pytest.fixture(name="upstream")
def upstream_fixture() -> ScriptedUpstream:
    return ScriptedUpstream()


@pytest.fixture(name="proxy")
async def proxy_fixture(upstream: ScriptedUpstream, tmp_path: Path) -> Any:
    app = make_app(upstream, tmp_path)
    async with client_for(app) as client:
        yield client
    await app.state.proxy.aclose()


# ----------------------------------------------------------------------------- a session that cuts


def story(i: int) -> str:
    return (
        f"Item {i}: The clerk recorded domo{i} at {i * 7}. " + "The rain kept on. " * 40
    ).strip()


async def run_items(
    client: httpx.AsyncClient, count: int, session: str, start: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    history = start or [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Task: keep the ledger."},
    ]
    for i in range(1, count + 1):
        history.append({"role": "user", "content": story(i)})
        response = await client.post(
            "/v1/chat/completions", json=chat(history), headers={"X-Keeper-Session": session}
        )
        assert response.status_code == 200, response.text
        history.append(response.json()["choices"][0]["message"])
    return history
