"""See keeper-proxy work offline, in one command, before pointing it at a real model server.

    keeper-proxy demo            (or: python -m keeper_middleware.integrations.proxy.demo)

It starts a scripted model server (an OpenAI-compatible upstream in a few lines: no model, no
network, nothing downloaded) and the real keeper-proxy in front of it with a small window, then
plays an agent that reports one ledger entry a turn and resends its whole history every time, as
agents do. The keeper archives old turns verbatim, keeps its NOTES, and the upstream never sees
more than the window; the demo prints what the proxy reports for the session at the end (the same
``GET /keeper/sessions/{id}`` an operator reads) and the largest request the upstream was sent.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

__all__ = ["DemoRun", "main", "run_demo", "scripted_upstream"]

SESSION = "demo"
_NOTE_CALLS = ("[NOTES REQUEST]", "[NOTES CHECK]")
_SHELVED = re.compile(r"parcel (P-\d+) was weighed at \d+ kg and shelved in aisle (\d+)")


@dataclass(slots=True)
class DemoRun:
    """What one demo showed."""

    replies: list[str] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)
    largest_upstream_request: int = 0
    """Messages in the largest request the upstream was sent."""
    history: int = 0
    """Messages the agent's last request carried."""


def scripted_upstream(seen: list[dict[str, Any]]) -> Starlette:
    """An OpenAI-compatible server that answers without a model: a note request gets a STATE
    line, any other request an acknowledgement of its last message. ``seen`` collects bodies."""

    def completion(text: str) -> dict[str, Any]:
        return {
            "id": "chatcmpl-scripted",
            "object": "chat.completion",
            "created": 0,
            "model": "scripted",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }

    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        seen.append(body)
        last = body["messages"][-1].get("content") or ""
        last = last if isinstance(last, str) else str(last)
        if last.startswith(_NOTE_CALLS):  # the change lines a model would write
            shelved = _SHELVED.findall(" ".join(str(m.get("content")) for m in body["messages"]))
            lines = ["RULE: Read each entry I send and acknowledge it."]
            lines += [f"SET {parcel} = aisle {aisle}" for parcel, aisle in shelved]
            return JSONResponse(completion("\n".join(dict.fromkeys(lines))))
        return JSONResponse(completion(f"Noted: {last[:60]}"))

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "scripted"}]})

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
        ]
    )


def entry(number: int) -> str:
    """One ledger entry, long enough that a few dozen of them overflow the demo's window."""
    return (
        f"Entry {number}: parcel P-{number * 7:04d} was weighed at {number % 9 + 1} kg and "
        f"shelved in aisle {number % 5 + 1}. " + "The harbour clerk initialled the page. " * 6
    )


def run_demo(
    turns: int = 40,
    *,
    window: int = 2048,
    folder: Path | None = None,
    say: Callable[[str], None] = print,
) -> DemoRun:
    """Play ``turns`` turns through keeper-proxy in front of the scripted upstream.

    Args:
        turns: agent requests to make (each adds one ledger entry and resends everything).
        window: the proxy's window in tokens (small, so the keeper cuts within the demo).
        folder: where the archive goes (default: a temporary folder, removed afterwards).
        say: where progress lines go.

    Raises:
        ConfigurationError: the window is too small for the keeper to work in.
    """
    from keeper_middleware.integrations.proxy.app import create_proxy_app
    from keeper_middleware.integrations.proxy.serving import serve_in_thread

    if folder is None:
        with tempfile.TemporaryDirectory() as temporary:
            return run_demo(turns, window=window, folder=Path(temporary), say=say)
    seen: list[dict[str, Any]] = []
    run = DemoRun()
    with serve_in_thread(scripted_upstream(seen)) as upstream_url:
        app = create_proxy_app(upstream_url, window=window, archive_dir=folder)
        with serve_in_thread(app) as proxy_url, httpx.Client(timeout=60) as client:
            history: list[dict[str, Any]] = [
                {"role": "system", "content": "You keep the harbour ledger."},
                {"role": "user", "content": "Read each entry I send and acknowledge it."},
            ]
            for number in range(1, turns + 1):
                history.append({"role": "user", "content": entry(number)})
                got = client.post(
                    f"{proxy_url}/chat/completions",
                    json={"model": "scripted", "messages": history},
                    headers={"X-Keeper-Session": SESSION},
                )
                got.raise_for_status()
                reply = got.json()["choices"][0]["message"]
                history.append(reply)
                run.replies.append(str(reply.get("content") or ""))
                if number % 10 == 0 or number == turns:
                    say(f"turn {number}: the agent sent {len(history) - 1} messages")
            root = proxy_url.removesuffix("/v1")
            run.report = client.get(f"{root}/keeper/sessions/{SESSION}").json()
    run.history = len(history) - 1  # the last request's, without the reply it got
    run.largest_upstream_request = max(len(body["messages"]) for body in seen)
    return run


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="keeper-proxy demo", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--turns", type=int, default=40, help="agent requests to play")
    parser.add_argument("--window", type=int, default=2048, help="the proxy's window in tokens")
    args = parser.parse_args(argv)
    run = run_demo(args.turns, window=args.window)
    report = run.report
    print()
    print(f"The agent's last request carried {run.history} messages; the largest request the")
    print(f"upstream was ever sent held {run.largest_upstream_request} (window: {args.window}).")
    print(
        f"Archived verbatim: {report['archive_turns']} turns; in view now: "
        f"{report['window_messages']} messages ({report['window_tokens']} tokens); "
        f"cuts: {report['counters'].get('cuts', 0)}."
    )
    print("\nThe NOTES the keeper keeps in view:\n")
    print(report["notes"])
    print("\nNext: keeper-proxy --upstream http://YOUR-SERVER/v1 --window 32768 --port 8100")
    return 0


if __name__ == "__main__":
    sys.exit(main())
