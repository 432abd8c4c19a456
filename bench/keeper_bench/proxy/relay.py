"""A bare pass-through relay: the floor for any proxy written in Python on the keeper proxy's stack.

    python -m keeper_bench.proxy.relay --upstream http://127.0.0.1:8000 --port 8200

It does what every HTTP proxy must and nothing else: read the request body, send it to the
upstream with one pooled aiohttp connection, and pass the status, content type and body back
(a stream chunk by chunk as it arrives). It parses no JSON, keeps no state and logs nothing. It is
served the way ``keeper-proxy`` is (uvicorn with uvloop and httptools, no access log, the same
garbage-collector settings: start-up objects frozen, the same young threshold), and calls
the upstream with the client ``keeper-proxy`` uses, so what ``keeper-proxy`` spends beyond it is
the keeper's own work (:mod:`.overhead` measures both side by side).

With ``--floor FILE`` it is the *fair floor*: the least any proxy that keeps conversations must
do. It also parses the JSON body (orjson) and writes one row per request to a SQLite file
(WAL, ``synchronous=NORMAL`` as the keeper's archive), committed before the request is
forwarded: what keeper-proxy does at the least, without the keeper.

With ``--keeping FILE`` it is the *keeping floor*: the least a proxy that keeps the conversation
must do under the rules keeper-proxy is held to (:class:`KeepingFloor`). Beyond the fair floor
it keeps the reply as well as the request's new turn, sends the upstream a body it encoded
itself (a keeper's upstream body is not the client's), and does its SQLite work and its token
count in worker threads, never on the event loop: one hand-off before the upstream call (count
the new turn's tokens, encode the body) and one after it (parse the reply, commit one row with
the new turn and the reply). It keeps no window, no notes and no index.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from keeper_middleware.startup import (
    SERVER_YOUNG_THRESHOLD,
    collect_young_less_often,
    freeze_startup_objects,
)

__all__ = ["relay_app"]

_PASSED_HEADERS = (b"content-type", b"authorization")


def floor_writer(path: Path) -> Callable[[bytes], None]:
    """Parse a request body and write one committed row for it (the fair floor's own work)."""
    import orjson

    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS requests (id INTEGER PRIMARY KEY, at REAL, session TEXT, "
        "messages INTEGER, last TEXT)"
    )

    def write(body: bytes) -> None:
        data = orjson.loads(body) if body else {}
        messages = data.get("messages") if isinstance(data, dict) else None
        count = len(messages) if isinstance(messages, list) else 0
        last = orjson.dumps(messages[-1]).decode() if count and messages else ""
        with conn:
            conn.execute(
                "INSERT INTO requests (at, session, messages, last) VALUES (?, ?, ?, ?)",
                (time.time(), str(data.get("user", "")), count, last),
            )

    return write


class KeepingFloor:
    """The keeping floor's own work, in two worker-thread jobs a request (see the module).

    Args:
        path: the SQLite file its rows go to (WAL, ``synchronous=NORMAL``, as the keeper's
            archive).
    """

    def __init__(self, path: Path) -> None:
        from keeper_middleware.tokens.counting import ApproximateTokenCounter

        self.tokens = ApproximateTokenCounter()  # keeper-proxy's default counter
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS turns (id INTEGER PRIMARY KEY, at REAL, session TEXT, "
            "tokens INTEGER, request TEXT, reply TEXT)"
        )

    def before_call(self, data: dict[str, Any]) -> tuple[bytes, int]:
        """(the upstream body, the new turn's tokens): the body encoded anew, as a keeper
        builds its own, and the last message's text counted."""
        import orjson

        messages = data.get("messages")
        last = messages[-1] if isinstance(messages, list) and messages else {}
        text = last.get("content") if isinstance(last, dict) else None
        tokens = self.tokens.count_text(text) if isinstance(text, str) else 0
        return orjson.dumps(data), tokens

    def after_call(self, session: str, data: dict[str, Any], tokens: int, reply: bytes) -> None:
        """Parse the reply and commit one row holding the new turn and the reply."""
        import orjson

        answer = orjson.loads(reply) if reply else {}
        choices = answer.get("choices") if isinstance(answer, dict) else None
        message = choices[0].get("message") if isinstance(choices, list) and choices else None
        messages = data.get("messages")
        last = messages[-1] if isinstance(messages, list) and messages else None
        with self.conn:
            self.conn.execute(
                "INSERT INTO turns (at, session, tokens, request, reply) VALUES (?, ?, ?, ?, ?)",
                (
                    time.time(),
                    session,
                    tokens,
                    orjson.dumps(last).decode(),
                    orjson.dumps(message).decode(),
                ),
            )


def relay_app(upstream: str, floor: Path | None = None, keeping: Path | None = None) -> Any:
    """The relay as a raw ASGI app; ``upstream`` is the server's base URL (without ``/v1``);
    with ``floor``, the fair floor (each body parsed and a row committed to that file first);
    with ``keeping``, the keeping floor (:class:`KeepingFloor`, its rows in that file)."""
    import aiohttp
    import orjson

    from keeper_middleware.integrations.proxy.sessions.workers import Workers

    keep = floor_writer(floor) if floor is not None else None
    keeper = KeepingFloor(keeping) if keeping is not None else None
    workers = Workers(2, 32, "keeping-floor") if keeper is not None else None

    base = upstream.rstrip("/")
    held: dict[str, aiohttp.ClientSession] = {}

    async def lifespan(receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                connector = aiohttp.TCPConnector(limit=256)
                held["client"] = aiohttp.ClientSession(
                    connector=connector, cookie_jar=aiohttp.DummyCookieJar()
                )
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await held["client"].close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        parts: list[bytes] = []
        message: Message = {"more_body": True}
        while message.get("more_body", False):
            message = await receive()
            parts.append(message.get("body", b""))
        headers = {k.decode(): v.decode() for k, v in scope["headers"] if k in _PASSED_HEADERS}
        url = base + scope["path"]
        body = b"".join(parts)
        if keep is not None and scope["method"] == "POST":
            keep(body)
        if keeper is not None and workers is not None and scope["method"] == "POST":
            data = orjson.loads(body) if body else {}
            if not (isinstance(data, dict) and data.get("stream")):  # streams pass through
                await _kept(keeper, workers, held["client"], url, data, headers, scope, send)
                return
        async with held["client"].request(
            scope["method"], url, data=body, headers=headers
        ) as reply:
            kind = reply.headers.get("content-type", "application/json")
            await send(
                {
                    "type": "http.response.start",
                    "status": reply.status,
                    "headers": [(b"content-type", kind.encode())],
                }
            )
            if "text/event-stream" not in kind:
                await send({"type": "http.response.body", "body": await reply.read()})
                return
            async for chunk in reply.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})

    return app


async def _kept(
    keeper: KeepingFloor,
    workers: Any,
    client: Any,
    url: str,
    data: dict[str, Any],
    headers: dict[str, str],
    scope: Scope,
    send: Send,
) -> None:
    """One request through the keeping floor, its reply whole (a stream is relayed as is)."""
    session = ""
    for name, value in scope["headers"]:
        if name == b"x-keeper-session":
            session = value.decode()
    sent, tokens = await workers.run(partial(keeper.before_call, data))
    async with client.request("POST", url, data=sent, headers=headers) as reply:
        content = await reply.read()
        kind = reply.headers.get("content-type", "application/json")
        status = reply.status
    await workers.run(partial(keeper.after_call, session, data, tokens, content))
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", kind.encode())],
        }
    )
    await send({"type": "http.response.body", "body": content})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--upstream", required=True, help="the upstream's base URL, without /v1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--floor", type=Path, default=None, help="be the fair floor, keeping rows in this file"
    )
    parser.add_argument(
        "--keeping",
        type=Path,
        default=None,
        help="be the keeping floor, keeping each new turn and its reply in this file",
    )
    parser.add_argument(
        "--gc-young-threshold",
        type=int,
        default=SERVER_YOUNG_THRESHOLD,
        help="allocations between young collections, as keeper-proxy's option of that name",
    )
    args = parser.parse_args(argv)
    import uvicorn

    app = relay_app(args.upstream, args.floor, args.keeping)
    freeze_startup_objects()  # as keeper-proxy does before it serves
    collect_young_less_often(args.gc_young_threshold)

    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
