"""The keeper proxy's upstream: the model server, called with retries and backoff in a budget.

Errors, 429s and timeouts are tried again with exponential backoff, waiting at least
as long as the upstream's ``Retry-After`` asks; when the tries or the time budget run out the
agent gets OpenAI's error shape with a status that says what happened: 504 (the upstream timed
out), 502 (unreachable, or it failed), the upstream's 429 or 503 (overloaded, with a
``Retry-After``). A ``Retry-After`` longer than :attr:`RetryPolicy.max_retry_after` is not waited
for inside the request: the agent gets the upstream's status and ``Retry-After`` at once, and its
own client decides when to come back. A 4xx from the upstream is not retried and is passed on
with the upstream's own message. Every try, failure and
retry is counted in the :class:`CallTally` the caller passes. The HTTP client underneath is
aiohttp where installed, else httpx (:mod:`.http_clients`).
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    stop_before_delay,
    wait_exponential_jitter,
)

from keeper_middleware.errors import ConfigurationError, KeeperError, MalformedDataError
from keeper_middleware.integrations.proxy.chat_completions.replies import (
    Completion,
    read_completion,
)
from keeper_middleware.integrations.proxy.chat_completions.streams import (
    StreamAssembler,
    StreamPiece,
)
from keeper_middleware.integrations.proxy.chat_completions.upstream import ChatApi
from keeper_middleware.integrations.proxy.conversation.chat_messages import body_json
from keeper_middleware.integrations.proxy.upstream.apis import UpstreamApi
from keeper_middleware.integrations.proxy.upstream.http_clients import (
    HttpClient,
    HttpReply,
    TransportError,
    default_client,
)
from keeper_middleware.integrations.proxy.upstream.sse import sse_data

__all__ = ["CallTally", "Forward", "RetryPolicy", "Upstream", "UpstreamError"]

Forward = Callable[[StreamPiece], Awaitable[None]]


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How hard the proxy tries an upstream call before the agent gets an error."""

    attempts: int = 4
    """Tries per upstream call (errors, 429s and timeouts are tried again)."""
    first_wait: float = 0.5
    """Seconds before the first retry; doubled each time up to ``max_wait``, each with up to
    ``first_wait`` more at random (jitter)."""
    max_wait: float = 8.0
    budget: float = 120.0
    """Seconds after which no new try starts (a ``Retry-After`` past it ends the tries)."""
    timeout: float = 600.0
    """Seconds one try may take (a thinking model can be slow)."""
    max_retry_after: float = 10.0
    """The longest ``Retry-After`` waited for inside a request; a longer one goes back to the
    agent at once, with the upstream's status (a client held that long inside one request
    cannot tell a wait from a hang)."""

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ConfigurationError("RetryPolicy.attempts must be at least 1 (1 means no retries)")
        if min(self.first_wait, self.max_wait, self.budget, self.max_retry_after) < 0:
            raise ConfigurationError(
                "RetryPolicy.first_wait, max_wait, budget and max_retry_after must be >= 0 seconds"
            )
        if self.timeout <= 0:
            raise ConfigurationError("RetryPolicy.timeout must be a positive number of seconds")


@dataclass(slots=True)
class CallTally:
    """What one request's upstream calls cost: tries, failed tries, retries, waiting time."""

    calls: int = 0
    failures: int = 0
    retries: int = 0
    seconds: float = 0.0
    """Seconds inside tries (waiting for the upstream)."""
    waited: float = 0.0
    """Seconds between tries (backoff and ``Retry-After``)."""


class UpstreamError(KeeperError):
    """The upstream could not answer; carries the status and code the agent receives."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        retry: bool,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.retry = status, code, message, retry
        self.retry_after = retry_after

    @property
    def rejected(self) -> bool:
        """The upstream refused the request itself (a 4xx other than 429): trying again, or
        later, gives the same answer."""
        return self.code == "upstream_rejected"


def check_upstream_url(url: str) -> None:
    """Refuse an upstream URL without http:// or https:// at start-up (``localhost:8011``
    would otherwise start, then say on every request that the upstream cannot be reached).

    Raises:
        ConfigurationError: the URL has no http or https scheme, or no host.
    """
    scheme, _, rest = url.partition("://")
    if scheme.lower() not in ("http", "https") or not rest.strip("/"):
        raise ConfigurationError(
            f"the upstream URL {url!r} has no http:// or https:// in front: add http:// "
            f"(e.g. http://{url.split('://')[-1] or 'localhost:8000/v1'})"
        )


def retry_after_seconds(value: str | None) -> float | None:
    """``Retry-After`` as seconds: a number or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class Upstream:
    """The model server, called with retries and backoff within a budget. ``transport``
    replaces the network with an httpx transport (tests pass ``httpx.MockTransport``)."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None,
        forward_auth: bool,
        retry: RetryPolicy,
        transport: httpx.AsyncBaseTransport | None = None,
        api: UpstreamApi | None = None,
    ) -> None:
        check_upstream_url(base_url)
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.forward_auth = forward_auth
        self.retry = retry
        self.api: UpstreamApi = api or ChatApi()
        self.url = f"{self.base_url}{self.api.path}"
        self.client: HttpClient = default_client(
            self.base_url, timeout=retry.timeout, transport=transport
        )

    def _headers(self, auth: str | None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        headers = {"content-type": "application/json"}
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        elif auth and self.forward_auth:
            headers["authorization"] = auth
        if self.api.name == "messages":  # Anthropic takes its key as x-api-key
            _, _, key = headers.pop("authorization", "").partition(" ")
            if key:
                headers["x-api-key"] = key
            headers["anthropic-version"] = "2023-06-01"
        if extra:
            headers.update(extra)
        return headers

    def _wait(self, state: RetryCallState) -> float:
        """Seconds before the next try: jittered exponential backoff, or longer if the upstream
        asks (``Retry-After``)."""
        policy = self.retry  # first_wait doubled each try up to max_wait, plus up to
        # first_wait at random: sessions that failed together do not all come back at once
        backoff = wait_exponential_jitter(
            initial=policy.first_wait, max=policy.max_wait, jitter=policy.first_wait
        )(state)
        error = state.outcome.exception() if state.outcome is not None else None
        asked = error.retry_after if isinstance(error, UpstreamError) else None
        return float(max(backoff, asked or 0.0))

    def _retryable(self, error: BaseException) -> bool:
        """A failure worth another try: the upstream said so (5xx, 429, a reset, a timeout)
        and asked for no longer a wait than a request may hold its agent (a longer
        ``Retry-After`` goes back to the agent at once, with the upstream's status)."""
        if not isinstance(error, UpstreamError) or not error.retry:
            return False
        return (error.retry_after or 0.0) <= self.retry.max_retry_after

    async def complete(
        self,
        body: Mapping[str, Any],
        *,
        auth: str | None,
        tally: CallTally,
        forward: Forward | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Completion:
        """The upstream's completion (a chat completion, whatever API the upstream speaks), read
        once into the keeper's form.
        With ``forward``, the upstream is asked for a stream and its text deltas are passed to
        ``forward`` until a tool call begins; a try that already passed text on is not
        repeated. ``headers`` are added to the request's own.

        A failed try is repeated (tenacity) while tries are left and the next one would start
        within the budget (counted from the first try); the last error is raised.

        Raises:
            UpstreamError: the last try's failure, with the status the agent gets.
        """
        chat = self.api.name == "chat"
        if forward is None:  # a window's forms joined from their kept JSON, byte for byte
            content = body_json(body)
        else:
            content = body_json(_streaming(body) if chat else {**body, "stream": True})

        async def once() -> Completion:
            tally.calls += 1
            started = time.perf_counter()
            try:
                if forward is None:
                    return await self._chat_once(content, auth, headers)
                if not chat:
                    return await self._stream_native(content, auth, forward, headers)
                return await self._stream_once(content, auth, forward)
            except UpstreamError:
                tally.failures += 1
                raise
            finally:
                tally.seconds += time.perf_counter() - started

        began = time.monotonic()  # as tenacity counts its budget
        try:  # the first try needs none of tenacity's machinery unless it fails
            return await once()
        except UpstreamError as error:
            if not self._retryable(error):
                raise
            first = error

        async def pause(seconds: float) -> None:
            slept = time.perf_counter()
            await asyncio.sleep(seconds)
            tally.waited += time.perf_counter() - slept

        tries = AsyncRetrying(
            stop=stop_after_attempt(self.retry.attempts) | stop_before_delay(self.retry.budget),
            wait=self._wait,
            retry=retry_if_exception(self._retryable),
            sleep=pause,
            reraise=True,
        )
        async for attempt in tries:
            with attempt:
                if attempt.retry_state.attempt_number == 1:  # the first try, as it went
                    attempt.retry_state.start_time = began
                    raise first
                tally.retries += 1
                return await once()
        raise AssertionError("unreachable: the last try returns or raises")

    async def _chat_once(
        self, content: bytes, auth: str | None, headers: Mapping[str, str] | None = None
    ) -> Completion:
        try:
            reply = await self.client.post(self.url, content, self._headers(auth, headers))
        except TransportError as exc:
            raise self._transport_error(exc) from exc
        _raise_for_status(reply)
        if self.api.name == "chat":
            return _completion(reply.body)
        return self._native(reply.body)

    def _native(self, content: bytes) -> Completion:
        """A Responses or Messages reply read into a chat completion."""
        try:
            data = orjson.loads(content)
            if not isinstance(data, dict):
                raise MalformedDataError("the reply is not a JSON object")
            return read_completion(self.api.read(data))
        except ValueError as exc:
            raise _bad_reply(str(exc), retry=True) from exc

    async def _stream_native(
        self,
        content: bytes,
        auth: str | None,
        forward: Forward,
        headers: Mapping[str, str] | None,
    ) -> Completion:
        """A Responses or Messages stream: events read by the API's assembler."""
        assembler = self.api.assembler()
        try:
            async with self.client.stream(
                self.url, content, self._headers(auth, headers)
            ) as response:
                if response.status >= 400:
                    body = await response.read()
                    _raise_for_status(
                        HttpReply(response.status, response.reason, response.headers, body)
                    )
                if "text/event-stream" not in response.headers.get("content-type", ""):
                    return self._native(await response.read())
                async for text in sse_data(response.lines()):
                    try:
                        event = orjson.loads(text)
                        if not isinstance(event, dict):
                            continue
                        problem = assembler.problem(event)
                        piece = None if problem else assembler.feed(event)
                    except ValueError as exc:
                        raise _bad_reply(f"a stream event: {exc}", retry=False) from exc
                    if problem:
                        raise UpstreamError(502, "upstream_error", problem, retry=False)
                    if piece is not None:
                        await forward(piece)
        except TransportError as exc:
            error = self._transport_error(exc)
            error.retry = error.retry and not assembler.forwarded
            raise error from exc
        if not assembler.complete:
            raise UpstreamError(
                502,
                "upstream_truncated",
                "The model server's stream ended before the reply was complete (no final "
                "event); the partial reply was not kept. Try again.",
                retry=not assembler.forwarded,
            )
        try:
            return read_completion(assembler.completion())
        except ValueError as exc:
            raise _bad_reply(str(exc), retry=not assembler.forwarded) from exc

    async def _stream_once(self, content: bytes, auth: str | None, forward: Forward) -> Completion:
        url = self.url
        assembler = StreamAssembler()
        try:
            async with self.client.stream(url, content, self._headers(auth)) as response:
                if response.status >= 400:
                    body = await response.read()
                    _raise_for_status(
                        HttpReply(response.status, response.reason, response.headers, body)
                    )
                if "text/event-stream" not in response.headers.get("content-type", ""):
                    return _completion(await response.read())
                async for text in sse_data(response.lines()):
                    payload = text.strip()
                    if payload == "[DONE]":
                        assembler.done = True
                        break
                    try:
                        chunk = orjson.loads(payload)
                    except orjson.JSONDecodeError as exc:
                        raise _bad_reply(f"a stream event is not JSON: {exc}", retry=False) from exc
                    if isinstance(chunk, dict) and isinstance(chunk.get("error"), dict):
                        message = str(chunk["error"].get("message") or chunk["error"])
                        raise UpstreamError(502, "upstream_error", message, retry=False)
                    piece = assembler.feed(chunk) if isinstance(chunk, dict) else None
                    if piece is not None:
                        await forward(piece)
        except TransportError as exc:
            error = self._transport_error(exc)
            error.retry = error.retry and not assembler.forwarded
            raise error from exc
        if not assembler.complete:
            raise UpstreamError(
                502,
                "upstream_truncated",
                "The model server's stream ended before the reply was complete (no finish "
                "reason, no [DONE]); the partial reply was not kept. Try again.",
                retry=not assembler.forwarded,
            )
        data = assembler.completion()
        try:
            return read_completion(data)
        except ValueError as exc:
            raise _bad_reply(str(exc), retry=not assembler.forwarded) from exc

    def _transport_error(self, exc: TransportError) -> UpstreamError:
        if exc.timed_out:
            return UpstreamError(
                504,
                "upstream_timeout",
                f"The model server at {self.base_url} did not answer in time "
                f"({exc.detail}, timeout {self.retry.timeout:g} s); try again later.",
                retry=True,
            )
        return UpstreamError(
            502,
            "upstream_unavailable",
            f"The model server at {self.base_url} cannot be reached ({exc.detail}); check that "
            "it is running.",
            retry=True,
        )

    async def get(self, path: str, *, auth: str | None) -> tuple[int, bytes]:
        try:
            reply = await self.client.get(f"{self.base_url}{path}", self._headers(auth))
        except TransportError as exc:
            raise self._transport_error(exc) from exc
        return reply.status, reply.body

    async def aclose(self) -> None:
        await self.client.aclose()


def _streaming(body: Mapping[str, Any]) -> dict[str, Any]:
    return {**body, "stream": True, "stream_options": {"include_usage": True}}


def _bad_reply(detail: str, *, retry: bool) -> UpstreamError:
    return UpstreamError(
        502,
        "upstream_bad_reply",
        f"The model server's reply could not be read: {detail}",
        retry=retry,
    )


def _completion(content: bytes) -> Completion:
    try:
        data = orjson.loads(content)
        if not isinstance(data, dict):
            raise MalformedDataError("the reply is not a JSON object")
        return read_completion(data)
    except ValueError as exc:
        raise _bad_reply(str(exc), retry=True) from exc


def _raise_for_status(response: HttpReply) -> None:
    status = response.status
    if status < 400:
        return
    asked = retry_after_seconds(response.headers.get("retry-after"))
    if status == 429:
        raise UpstreamError(
            429,
            "upstream_overloaded",
            "The model server is overloaded (429); try again later.",
            retry=True,
            retry_after=asked,
        )
    if status >= 500:
        raise UpstreamError(
            503 if status == 503 else 502,
            "upstream_error",
            f"The model server failed ({status}): {_upstream_message(response)}",
            retry=True,
            retry_after=asked,
        )
    raise UpstreamError(
        status,
        "upstream_rejected",
        f"The model server rejected the request: {_upstream_message(response)}",
        retry=False,
    )


def _upstream_message(response: HttpReply) -> str:
    try:
        error = orjson.loads(response.body).get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
    except (ValueError, AttributeError):
        pass
    return response.body[:2000].decode("utf-8", errors="replace")[:500] or response.reason


def retry_after_header(error: UpstreamError, policy: RetryPolicy) -> dict[str, str]:
    """The ``Retry-After`` the agent gets with a 429 or 503: the upstream's, else the longest
    backoff."""
    if error.status not in (429, 503):
        return {}
    seconds = error.retry_after if error.retry_after is not None else policy.max_wait
    return {"retry-after": str(max(1, math.ceil(seconds)))}
