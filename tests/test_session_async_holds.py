"""An asyncio hold of a session (:meth:`SessionLocks.ahold`): one holder at a time, re-entrant
along one flow of control, the ``taken`` callback run only by the hold that took it, and the
session given back however the body ends (an error, a failing callback, a cancelled waiter)."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from keeper_middleware.sessions.locks import SessionLocks

pytestmark = pytest.mark.anyio


async def test_a_second_task_waits_for_the_first_to_give_the_session_back() -> None:
    locks, order = SessionLocks(), list[tuple[str, str, bool]]()

    async def request(name: str, pause: float) -> None:
        async with locks.ahold("s") as took:
            order.append((name, "in", took))
            await asyncio.sleep(pause)
            order.append((name, "out", took))

    await asyncio.gather(request("a", 0.02), request("b", 0.0))
    assert order == [("a", "in", True), ("a", "out", True), ("b", "in", True), ("b", "out", True)]
    assert not locks.held("s")


async def test_a_hold_within_a_hold_is_a_no_op_and_the_callback_runs_once() -> None:
    locks, taken = SessionLocks(), list[str]()
    async with locks.ahold("s", taken.append) as outer:
        assert locks.held("s")
        async with locks.ahold("s", taken.append) as inner:
            assert (outer, inner) == (True, False)
        assert locks.held("s")  # the inner hold gave nothing back
    assert taken == ["s"] and not locks.held("s")
    async with locks.ahold("s") as again:  # free for the next request
        assert again


async def test_an_error_in_the_body_or_the_callback_gives_the_session_back() -> None:
    locks = SessionLocks()
    with pytest.raises(ValueError, match="body"):
        async with locks.ahold("s"):
            raise ValueError("body")
    assert not locks.held("s")

    def fails(session: str) -> None:
        raise RuntimeError(f"cannot read {session}")

    with pytest.raises(RuntimeError, match="cannot read s"):
        async with locks.ahold("s", fails):
            pytest.fail("the body must not run")
    assert not locks.held("s")
    async with locks.ahold("s") as took:
        assert took


async def test_a_cancelled_waiter_takes_nothing() -> None:
    locks = SessionLocks()
    async with locks.ahold("s"):
        other = contextvars.Context()  # another request's flow of control, holding nothing
        waiter = asyncio.create_task(locks.ahold("s").__aenter__(), context=other)
        await asyncio.sleep(0.01)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
    async with locks.ahold("s") as took:
        assert took
