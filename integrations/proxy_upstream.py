"""The keeper proxy's upstream: the model server, called with retries and backoff in a budget.

Errors, 429s and timeouts are tried again with exponential backoff (tenacity); when the tries or
the time budget run out the agent gets OpenAI's error shape with a status that says what happened:
504 (the upstream timed out), 502 (unreachable, or it failed), 503 (overloaded). A 4xx from the
upstream is not retried and is passed on with the upstream's own message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)

from keeper_middleware.integrations.openai_format import ai_from_completion

__all__ = ["RetryPolicy", "Upstream", "UpstreamError"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How hard the proxy tries an upstream call before the agent gets an error."""

    attempts: int = 4
    """Tries per upstream call (errors, 429s and timeouts are tried again)."""
    first_wait: float = 0.5
    """Seconds before the first retry; doubled each time up to ``max_wait``."""
    max_wait: float = 8.0
    budget: float = 120.0
    """Seconds after which no new try starts."""
    timeout: float = 600.0
    """Seconds one try may take (a thinking model can be slow)."""

    def __post_init__(self) -> None:
        if self.attempts < 1 or min(self.first_wait, self.max_wait, self.budget) < 0:
            raise ValueError("RetryPolicy needs attempts >= 1 and waits/budget >= 0 seconds")
        if self.timeout <= 0:
            raise ValueError("RetryPolicy.timeout must be a positive number of seconds")


class UpstreamError(Exception):
    """The upstream could not answer; carries the status and code the agent receives."""

    def __init__(self, status: int, code: str, message: str, *, retry: bool) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.retry = status, code, message, retry


class Upstream:
    """The model server, called with retries and backoff within a budget."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None,
        forward_auth: bool,
        retry: RetryPolicy,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.forward_auth = forward_auth
        self.retry = retry
        self.client = httpx.AsyncClient(timeout=retry.timeout, transport=transport)

    def _headers(self, auth: str | None) -> dict[str, str]:
        if self.api_key:
            return {"authorization": f"Bearer {self.api_key}"}
        return {"authorization": auth} if auth and self.forward_auth else {}

    async def chat(
        self, body: Mapping[str, Any], *, auth: str | None
    ) -> tuple[dict[str, Any], int]:
        """The upstream's completion and how many retries it took."""
        tries = 0
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.retry.attempts) | stop_after_delay(self.retry.budget),
            wait=wait_exponential(multiplier=self.retry.first_wait, max=self.retry.max_wait),
            retry=retry_if_exception(lambda e: isinstance(e, UpstreamError) and e.retry),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                tries += 1
                return await self._chat_once(body, auth), tries - 1
        raise AssertionError("unreachable: tenacity re-raises the last error")

    async def _chat_once(self, body: Mapping[str, Any], auth: str | None) -> dict[str, Any]:
        url = f"{self.base_url}/chat/completions"
        try:
            response = await self.client.post(url, json=body, headers=self._headers(auth))
        except httpx.TimeoutException as exc:
            raise UpstreamError(
                504,
                "upstream_timeout",
                f"The model server at {self.base_url} did not answer "
                f"in time ({exc!r}); try again later.",
                retry=True,
            ) from exc
        except httpx.TransportError as exc:
            raise UpstreamError(
                502,
                "upstream_unavailable",
                f"The model server at {self.base_url} cannot be "
                f"reached ({exc!r}); check that it is running.",
                retry=True,
            ) from exc
        if response.status_code == 429:
            raise UpstreamError(
                503,
                "upstream_overloaded",
                "The model server is overloaded (429); try again later.",
                retry=True,
            )
        if response.status_code >= 500:
            status = 503 if response.status_code == 503 else 502
            raise UpstreamError(
                status,
                "upstream_error",
                f"The model server failed ({response.status_code}): {_upstream_message(response)}",
                retry=True,
            )
        if response.status_code >= 400:
            raise UpstreamError(
                response.status_code,
                "upstream_rejected",
                f"The model server rejected the request: {_upstream_message(response)}",
                retry=False,
            )
        try:
            data = response.json()
            ai_from_completion(data)
        except ValueError as exc:
            raise UpstreamError(
                502,
                "upstream_bad_reply",
                f"The model server's reply could not be read: {exc}",
                retry=True,
            ) from exc
        return data  # type: ignore[no-any-return]

    async def get(self, path: str, *, auth: str | None) -> tuple[int, bytes]:
        try:
            response = await self.client.get(f"{self.base_url}{path}", headers=self._headers(auth))
        except httpx.TimeoutException as exc:
            raise UpstreamError(504, "upstream_timeout", f"{exc!r}", retry=True) from exc
        except httpx.TransportError as exc:
            raise UpstreamError(
                502,
                "upstream_unavailable",
                f"The model server at {self.base_url} cannot be reached ({exc!r}).",
                retry=True,
            ) from exc
        return response.status_code, response.content

    async def aclose(self) -> None:
        await self.client.aclose()


def _upstream_message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
    except (ValueError, AttributeError):
        pass
    return response.text[:500] or response.reason_phrase
