"""The httpx client builds each upstream request itself, from a URL parsed once: the upstream
gets exactly what ``httpx.AsyncClient`` would have sent (method, URL, headers in their order
and case, body, timeouts), a reply is read whole or line by line, and a failure of the
transport is a :class:`TransportError` as before."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from keeper_middleware.integrations.proxy.upstream.http_clients import (
    HttpxClient,
    TransportError,
)

pytestmark = pytest.mark.anyio
URL = "http://upstream.test:8011/v1/chat/completions"
HEADERS = {"content-type": "application/json", "authorization": "Bearer k", "accept": "x/y"}


def _seen(into: list[Any], reply: httpx.Response) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        into.append((request.method, str(request.url), request.headers.raw, request.content,
                     request.extensions))  # fmt: skip
        return reply

    return httpx.MockTransport(handle)


async def test_a_post_carries_what_the_client_itself_would_send() -> None:
    seen: list[Any] = []
    client = HttpxClient(timeout=7.0, transport=_seen(seen, httpx.Response(200, content=b"{}")))
    for body in (b'{"a": 1}', b'{"a": 12}', b""):  # the second from the first's template
        reply = await client.post(URL, body, HEADERS)
        assert (reply.status, reply.reason, reply.body) == (200, "OK", b"{}")
        await client.client.post(URL, content=body, headers=HEADERS)
    assert seen[0] == seen[1] and seen[2] == seen[3] and seen[4] == seen[5]
    assert dict(seen[2][2])[b"Content-Length"] == b"9"
    names = [name for name, _ in seen[0][2]]
    assert names.count(b"accept") == 1 and b"Accept" not in names  # a given header wins
    await client.aclose()


async def test_each_key_forwarded_is_sent_with_its_own_request() -> None:
    seen: list[Any] = []
    client = HttpxClient(timeout=7.0, transport=_seen(seen, httpx.Response(200, content=b"{}")))
    for key in ("Bearer one", "Bearer two", "Bearer one"):
        await client.post(URL, b"{}", {**HEADERS, "authorization": key})
    assert [dict(raw)[b"authorization"] for _, _, raw, _, _ in seen] == [
        b"Bearer one",
        b"Bearer two",
        b"Bearer one",
    ]


async def test_a_stream_is_read_line_by_line_and_closed() -> None:
    closed: list[bool] = []

    class Body(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            for chunk in (b"data: one\n\ndata: ", b"two\n\n"):
                yield chunk

        async def aclose(self) -> None:
            closed.append(True)

    reply = httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Body())
    client = HttpxClient(timeout=7.0, transport=_seen([], reply))
    async with client.stream(URL, b"{}", HEADERS) as got:
        assert (got.status, got.headers["content-type"]) == (200, "text/event-stream")
        lines = [line async for line in got.lines()]
    assert lines == ["data: one", "", "data: two", ""]
    assert closed == [True]


async def test_a_transport_failure_is_a_transport_error() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    client = HttpxClient(timeout=7.0, transport=httpx.MockTransport(refuse))
    with pytest.raises(TransportError, match="ConnectError: refused") as caught:
        await client.post(URL, b"{}", HEADERS)
    assert not caught.value.timed_out
    with pytest.raises(TransportError, match="ConnectError"):
        async with client.stream(URL, b"{}", HEADERS):
            pass


async def test_no_cookie_of_the_upstream_is_kept() -> None:
    seen: list[Any] = []
    set_cookie = httpx.Response(200, content=b"{}", headers={"set-cookie": "tenant=a; Path=/"})
    client = HttpxClient(timeout=7.0, transport=_seen(seen, set_cookie))
    await client.client.post(URL, content=b"{}", headers=HEADERS)  # the client's own path
    await client.post(URL, b"{}", HEADERS)
    assert not client.client.cookies
    assert all(
        b"cookie" not in dict(raw) and b"Cookie" not in dict(raw) for _, _, raw, _, _ in seen
    )
