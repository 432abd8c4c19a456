"""The agent's calls go straight to their handler; every other request goes through Starlette.

An agent's ``POST`` to ``/v1/chat/completions``, ``/v1/responses`` or ``/v1/messages`` is most
of what the proxy serves, and Starlette's layers (the error and exception middleware, the
router's match over every route, the exception wrapper around the endpoint) cost more CPU per
request than the relay the proxy is measured against spends in all. Those three routes are
matched by one dictionary lookup and their handlers called as Starlette would call them, with
the same request object; an error the handler does not turn into a response itself is answered
as Starlette's own error middleware answers it (``500 Internal Server Error``, as plain text,
if nothing was sent yet) and raised on to the server, which logs it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import Message, Receive, Scope, Send

from keeper_middleware.integrations.proxy.conversation.form import RequestError

__all__ = ["Endpoint", "ProxyApp", "read_json"]

Endpoint = Callable[[Request], Awaitable[Response]]


class ProxyApp(Starlette):
    """A Starlette app whose ``hot`` routes (path → handler, ``POST`` only) skip its layers.

    Args:
        hot: the handlers called directly, by exact path; they must also be among ``routes``
            (other methods, a trailing slash or a mounted root path go the ordinary way).
        **kwargs: Starlette's own arguments.
    """

    def __init__(self, *, hot: Mapping[str, Endpoint], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hot = dict(hot)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            endpoint = self.hot.get(scope["path"])
            if endpoint is not None:
                scope["app"] = self
                await _serve(endpoint, scope, receive, send)
                return
        await super().__call__(scope, receive, send)


async def _serve(endpoint: Endpoint, scope: Scope, receive: Receive, send: Send) -> None:
    """Call ``endpoint`` and send its response, as Starlette's ``request_response`` does."""
    started = False

    async def sending(message: Message) -> None:
        nonlocal started
        if message["type"] == "http.response.start":
            started = True
        await send(message)

    try:
        response = await endpoint(Request(scope, receive, send))
        await response(scope, receive, sending)
    except Exception:
        if not started:  # what Starlette's ServerErrorMiddleware answers
            await PlainTextResponse("Internal Server Error", status_code=500)(scope, receive, send)
        raise


async def read_json(request: Request, limit: int) -> object:
    """The request's body parsed once (orjson), refused past ``limit`` bytes.

    The body is taken from the server's messages directly, as ``Request.stream`` takes it (a
    disconnect before its end raises ``ClientDisconnect``), without an async generator.

    Raises:
        RequestError: the body is larger than ``limit`` (413) or not valid JSON (400).
        ClientDisconnect: the client hung up before the body's end.
    """
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_big(limit)
    receive, size, chunks = request.receive, 0, []
    while True:
        message = await receive()
        kind = message["type"]
        if kind == "http.request":
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _too_big(limit)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        elif kind == "http.disconnect":
            raise ClientDisconnect()
    try:
        return orjson.loads(chunks[0] if len(chunks) == 1 else b"".join(chunks))
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"The request body is not valid JSON: {exc}.") from exc


def _too_big(limit: int) -> RequestError:
    return RequestError(
        f"The request is larger than {limit} bytes (the proxy's --max-body-mb).", status=413
    )
