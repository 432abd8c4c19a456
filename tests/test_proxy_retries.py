"""How the proxy tries an upstream call again (tenacity underneath): jittered exponential
backoff, a Retry-After honoured up to its cap, and a 429 that asks for longer than a request
may hold its agent passed back at once. Note calls go through the same path. The waits are
recorded instead of slept."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from keeper_middleware.integrations.proxy.upstream import client as upstream_module
from keeper_middleware.integrations.proxy.upstream.client import (
    CallTally,
    RetryPolicy,
    Upstream,
    UpstreamError,
)
from tests.proxy_upstream import text_reply

pytestmark = pytest.mark.anyio
BODY = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}


@pytest.fixture(name="waits")
def waits_fixture(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every wait between tries, in seconds (not slept)."""
    waited: list[float] = []
    sleep = asyncio.sleep

    async def record(seconds: float, *args: Any, **kwargs: Any) -> Any:
        waited.append(seconds)
        return await sleep(0)

    monkeypatch.setattr(upstream_module.asyncio, "sleep", record)
    return waited


def scripted(*answers: httpx.Response) -> tuple[Callable[[httpx.Request], httpx.Response], list]:
    """A transport handler playing ``answers`` (the last one repeats), and its requests."""
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answers[min(len(seen), len(answers)) - 1]

    return handle, seen


async def call(policy: RetryPolicy, *answers: httpx.Response) -> tuple[Any, CallTally, list]:
    handle, seen = scripted(*answers)
    upstream = Upstream(
        "http://upstream.test/v1",
        api_key=None,
        forward_auth=False,
        retry=policy,
        transport=httpx.MockTransport(handle),
    )
    tally = CallTally()
    try:
        return (await upstream.complete(BODY, auth=None, tally=tally)).data, tally, seen
    except UpstreamError as error:
        return error, tally, seen
    finally:
        await upstream.aclose()


FAILED = httpx.Response(503, json={"error": {"message": "busy"}})
OK = httpx.Response(200, json=text_reply("fine"))


async def test_backoff_doubles_up_to_its_cap_with_jitter(waits):
    policy = RetryPolicy(attempts=5, first_wait=1.0, max_wait=3.0, budget=100.0)
    firsts = []
    for _ in range(6):
        waits.clear()
        data, tally, seen = await call(policy, FAILED, FAILED, FAILED, FAILED, OK)
        assert data["choices"][0]["message"]["content"] == "fine"
        assert (tally.calls, tally.failures, tally.retries, len(seen)) == (5, 4, 4, 5)
        first, second, third, fourth = waits
        assert 1.0 <= first <= 2.0 and 2.0 <= second <= 3.0  # 1 s, 2 s, each plus jitter
        assert third == fourth == 3.0  # 4 s and 8 s, capped
        firsts.append(first)
    assert len(set(firsts)) > 1  # jittered: sessions failing together come back apart


async def test_a_retry_after_is_honoured_up_to_its_cap(waits):
    policy = RetryPolicy(attempts=3, first_wait=0.1, max_wait=0.2, max_retry_after=10.0)
    asked = httpx.Response(429, headers={"retry-after": "7"}, json={})
    data, tally, _ = await call(policy, asked, OK)
    assert data["choices"][0]["message"]["content"] == "fine"
    assert waits == [7.0] and tally.retries == 1


async def test_a_429_asking_for_longer_than_the_cap_is_passed_back_at_once(waits):
    policy = RetryPolicy(attempts=4, first_wait=0.1, max_wait=0.2, max_retry_after=10.0)
    refused = httpx.Response(429, headers={"retry-after": "30"}, json={})
    error, tally, seen = await call(policy, refused, OK)
    assert isinstance(error, UpstreamError)
    assert (error.status, error.code, error.retry_after) == (429, "upstream_overloaded", 30.0)
    assert len(seen) == 1 and waits == [] and tally.failures == 1


async def test_a_rejection_is_never_tried_again(waits):
    rejected = httpx.Response(400, json={"error": {"message": "bad field"}})
    error, _, seen = await call(RetryPolicy(attempts=4, first_wait=0.1), rejected, OK)
    assert isinstance(error, UpstreamError) and error.rejected
    assert len(seen) == 1 and waits == []


async def test_the_tries_end_when_the_next_would_start_past_the_budget():
    """Waits really slept here: the budget is counted on the clock from the first try."""
    policy = RetryPolicy(attempts=10, first_wait=0.2, max_wait=0.2, budget=0.5)
    error, tally, seen = await call(policy, FAILED)
    assert isinstance(error, UpstreamError) and error.status == 503
    assert len(seen) == 3  # tries at 0, 0.2 and 0.4 s; one at 0.6 s would pass the budget
    assert tally.waited >= 0.4
