"""The HTTP/1.1 clients the proxy's upstream calls go through: aiohttp, or httpx.

The proxy makes one upstream call for every agent call, so the client's own cost per request is
paid on every call on the event loop. aiohttp (C parser, a plain connection pool) costs about a
tenth of httpx's per request with 32 agents at once, so it is the default when installed; httpx
serves where a transport is injected (tests pass ``httpx.MockTransport``) or aiohttp is missing.
Both speak the same small :class:`HttpClient` protocol and report every network failure as a
:class:`TransportError`, so the retry logic above them (:mod:`.client`) is one.

Timeouts mean the same in both: ``timeout`` seconds to connect (including the wait for a free
connection) and ``timeout`` seconds between two reads, not a limit on the whole reply, so a long
stream that keeps sending is never cut.
"""

from __future__ import annotations

import asyncio
import http.cookiejar
import urllib.request
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx

from keeper_middleware.errors import KeeperError

__all__ = [
    "AiohttpClient",
    "HttpClient",
    "HttpReply",
    "HttpxClient",
    "StreamingReply",
    "TransportError",
    "default_client",
    "split_lines",
]

MAX_CONNECTIONS = 256
"""Upstream connections open at once at most; more calls wait for one (within the timeout)."""
MAX_HEADER_BYTES = 64 * 1024
"""The longest response header line accepted (aiohttp's own default is 8 KB)."""


@dataclass(frozen=True, slots=True)
class HttpReply:
    """A whole HTTP response."""

    status: int
    reason: str
    headers: Mapping[str, str]
    """Case-insensitive, as both clients give them."""
    body: bytes


class TransportError(KeeperError):
    """The request got no complete answer: unreachable, cut off, or too slow."""

    def __init__(self, detail: str, *, timed_out: bool) -> None:
        super().__init__(detail)
        self.detail, self.timed_out = detail, timed_out


class StreamingReply(Protocol):
    """A response whose body is read as it arrives."""

    status: int
    reason: str
    headers: Mapping[str, str]

    async def read(self) -> bytes:
        """The rest of the body."""
        ...

    def lines(self) -> AsyncIterator[str]:
        """The body line by line (``\\n``, ``\\r\\n`` or ``\\r`` ends a line), without the ends."""
        ...


class HttpClient(Protocol):
    """What the upstream needs of an HTTP client; failures raise :class:`TransportError`."""

    async def post(self, url: str, content: bytes, headers: Mapping[str, str]) -> HttpReply: ...

    def stream(
        self, url: str, content: bytes, headers: Mapping[str, str]
    ) -> AbstractAsyncContextManager[StreamingReply]:
        """POST and read the reply as it comes; failures while reading raise too."""
        ...

    async def get(self, url: str, headers: Mapping[str, str]) -> HttpReply: ...

    async def aclose(self) -> None: ...


def split_lines(pending: bytes, chunk: bytes) -> tuple[list[bytes], bytes]:
    """The complete lines of ``pending + chunk`` and what is left after the last one. A ``\\r``
    at the very end is kept back: the ``\\n`` of a ``\\r\\n`` may come in the next chunk."""
    data = pending + chunk
    if b"\r" in data:
        keep = data.endswith(b"\r")
        body = data[:-1] if keep else data
        body = body.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        data = body + b"\r" if keep else body
    *lines, rest = data.split(b"\n")
    return lines, rest


# -- httpx --------------------------------------------------------------------------------------
MAX_TEMPLATES = 1024
"""Request templates kept (one per upstream URL and set of headers: per API key forwarded)."""


@dataclass(frozen=True, slots=True)
class _Template:
    url: httpx.URL
    headers: httpx.Headers


def _httpx_failure(exc: httpx.TransportError) -> TransportError:
    return TransportError(
        f"{type(exc).__name__}: {exc}" if str(exc) else repr(exc),
        timed_out=isinstance(exc, httpx.TimeoutException),
    )


class _HttpxStream:
    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.status = response.status_code
        self.reason = response.reason_phrase
        self.headers: Mapping[str, str] = response.headers

    async def read(self) -> bytes:
        return await self.response.aread()

    async def lines(self) -> AsyncIterator[str]:
        async for line in self.response.aiter_lines():
            yield line


class HttpxClient:
    """httpx: any transport (``httpx.MockTransport`` in tests), or the network.

    Every upstream call goes to one or two URLs fixed at start-up with the same few headers, so
    the client's ``build_request`` (a URL parse and merge, a header merge and normalization, a
    cookie merge) runs once for each URL and set of headers, and every request is made from
    that template with its own body and ``Content-Length``, byte for byte as the client makes
    it. With an
    injected transport the request goes to it directly, past the client's auth, redirect and
    cookie layers (none of which the proxy uses: one upstream connection serves every tenant, so
    no cookie is kept, as with aiohttp); over the network it goes through ``client.send``, which
    picks the proxy the environment names.
    """

    def __init__(self, *, timeout: float, transport: httpx.AsyncBaseTransport | None = None):
        limits = httpx.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=64)
        self.client = httpx.AsyncClient(timeout=timeout, transport=transport, limits=limits)
        # no cookie is ever kept (one connection serves every tenant; a template would keep
        # whatever the jar held when it was made)
        self.client.cookies.jar.set_policy(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
        self._transport = transport
        self._extensions = {"timeout": httpx.Timeout(timeout).as_dict()}
        self._templates: dict[tuple[str, tuple[tuple[str, str], ...]], _Template] = {}

    @staticmethod
    def _reply(response: httpx.Response) -> HttpReply:
        return HttpReply(
            response.status_code, response.reason_phrase, response.headers, response.content
        )

    def _template(self, url: str, headers: Mapping[str, str]) -> _Template:
        """The URL parsed and the headers merged and normalized, as ``client.build_request``
        does, for a ``POST`` to ``url`` with ``headers`` (what varies is the body's length)."""
        key = (url, tuple(headers.items()))
        template = self._templates.get(key)
        if template is None:
            if len(self._templates) >= MAX_TEMPLATES:  # as many as keys forwarded, at most
                self._templates.clear()
            built = self.client.build_request("POST", url, headers=headers, content=b"{}")
            template = self._templates[key] = _Template(built.url, built.headers)
        return template

    def _request(self, url: str, content: bytes, headers: Mapping[str, str]) -> httpx.Request:
        """A ``POST`` exactly as ``client.build_request`` makes it, from a template."""
        if not content:  # no Content-Length to put in the template's place for it
            return self.client.build_request("POST", url, headers=headers, content=content)
        template = self._template(url, headers)
        merged = httpx.Headers(template.headers)
        merged["Content-Length"] = str(len(content))  # in the template's place for it
        request = httpx.Request(
            "POST",
            template.url,
            headers=merged,
            stream=httpx.ByteStream(content),
            extensions=self._extensions,
        )
        request.read()  # the body is held, as a request built with ``content`` holds it
        return request

    async def _send(self, request: httpx.Request) -> httpx.Response:
        """The response with its body not read yet (the caller reads and closes it)."""
        if self._transport is None:
            return await self.client.send(request, stream=True)
        response = await self._transport.handle_async_request(request)
        response.request = request
        return response

    async def post(self, url: str, content: bytes, headers: Mapping[str, str]) -> HttpReply:
        try:
            response = await self._send(self._request(url, content, headers))
            try:
                await response.aread()
            finally:
                await response.aclose()
            return self._reply(response)
        except httpx.TransportError as exc:
            raise _httpx_failure(exc) from exc

    @asynccontextmanager
    async def stream(
        self, url: str, content: bytes, headers: Mapping[str, str]
    ) -> AsyncIterator[StreamingReply]:
        try:
            response = await self._send(self._request(url, content, headers))
            try:
                yield _HttpxStream(response)
            finally:
                await response.aclose()
        except httpx.TransportError as exc:
            raise _httpx_failure(exc) from exc

    async def get(self, url: str, headers: Mapping[str, str]) -> HttpReply:
        try:
            return self._reply(await self.client.get(url, headers=headers))
        except httpx.TransportError as exc:
            raise _httpx_failure(exc) from exc

    async def aclose(self) -> None:
        await self.client.aclose()


# -- aiohttp ------------------------------------------------------------------------------------
def env_proxy(url: str) -> str | None:
    """The proxy the environment (``HTTP_PROXY``, ``HTTPS_PROXY``, ``NO_PROXY``) names for
    ``url``, as httpx would use it; read once, not on every request."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies_environment()
    chosen = proxies.get(parts.scheme) or proxies.get("all")
    if not chosen or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return chosen


class _AiohttpStream:
    def __init__(self, response: Any) -> None:
        self.response = response
        self.status = int(response.status)
        self.reason = str(response.reason or "")
        self.headers: Mapping[str, str] = response.headers

    async def read(self) -> bytes:
        return bytes(await self.response.read())

    async def lines(self) -> AsyncIterator[str]:
        pending = b""
        async for chunk in self.response.content.iter_any():
            lines, pending = split_lines(pending, chunk)
            for line in lines:
                yield line.decode("utf-8", errors="replace")
        if pending.rstrip(b"\r"):
            yield pending.rstrip(b"\r").decode("utf-8", errors="replace")


class AiohttpClient:
    """aiohttp with one connection pool, created on first use in the running event loop (and
    again if a later call runs in another loop). Cookies are never kept: one upstream connection
    serves every tenant."""

    def __init__(self, *, timeout: float, proxy: str | None = None) -> None:
        self.timeout = timeout
        self.proxy = proxy
        self._session: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _client(self) -> Any:
        import aiohttp

        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            connector = aiohttp.TCPConnector(limit=MAX_CONNECTIONS, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                timeout=aiohttp.ClientTimeout(
                    total=None, connect=self.timeout, sock_read=self.timeout
                ),
                max_line_size=MAX_HEADER_BYTES,
                max_field_size=MAX_HEADER_BYTES,
            )
            self._loop = loop
        return self._session

    @staticmethod
    def _failure(exc: BaseException) -> TransportError:
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else repr(exc)
        return TransportError(detail, timed_out=isinstance(exc, TimeoutError))

    async def _whole(self, method: str, url: str, content: bytes | None, headers: Any) -> HttpReply:
        import aiohttp

        try:
            async with self._client().request(
                method, url, data=content, headers=headers, proxy=self.proxy
            ) as response:
                body = await response.read()
                return HttpReply(response.status, response.reason or "", response.headers, body)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise self._failure(exc) from exc

    async def post(self, url: str, content: bytes, headers: Mapping[str, str]) -> HttpReply:
        return await self._whole("POST", url, content, headers)

    @asynccontextmanager
    async def stream(
        self, url: str, content: bytes, headers: Mapping[str, str]
    ) -> AsyncIterator[StreamingReply]:
        import aiohttp

        try:
            async with self._client().post(
                url, data=content, headers=headers, proxy=self.proxy
            ) as response:
                yield _AiohttpStream(response)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise self._failure(exc) from exc

    async def get(self, url: str, headers: Mapping[str, str]) -> HttpReply:
        return await self._whole("GET", url, None, headers)

    async def aclose(self) -> None:
        """Close the pool (one made in another event loop can only be dropped)."""
        session, self._session = self._session, None
        if session is not None and not session.closed and self._loop is _running_loop():
            await session.close()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def default_client(
    base_url: str, *, timeout: float, transport: httpx.AsyncBaseTransport | None = None
) -> HttpClient:
    """aiohttp when it is installed and no httpx transport is given; httpx otherwise."""
    if transport is None:
        try:
            import aiohttp  # noqa: F401
        except ImportError:
            pass
        else:
            return AiohttpClient(timeout=timeout, proxy=env_proxy(base_url))
    return HttpxClient(timeout=timeout, transport=transport)
