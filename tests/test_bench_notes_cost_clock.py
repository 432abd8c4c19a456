"""The notes-cost clock: every second of the keeper's CPU in exactly one phase, none of the model's.

A hand-turned clock stands in for the process's CPU time, so the figures are exact."""

from __future__ import annotations

import asyncio

import pytest

from keeper_bench.notes_cost.clock import MODEL, PHASES, SPANS, KeeperClock


class HandClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def spend(self, seconds: float) -> None:
        self.now += seconds


def test_a_phase_inside_another_is_taken_out_of_the_outer_ones_time() -> None:
    hand = HandClock()
    clock = KeeperClock(hand)
    index = clock.timed("indexing", lambda: hand.spend(2.0))

    def commit() -> None:
        hand.spend(1.0)
        index()
        hand.spend(0.5)

    clock.timed("commit", commit)()
    assert clock.phases["commit"] == pytest.approx(1.5)
    assert clock.phases["indexing"] == pytest.approx(2.0)
    assert clock.keeper == pytest.approx(3.5)


def _span(clock: KeeperClock, phase: str, work) -> None:
    clock.phase_started(phase, "s")
    try:
        work()
    finally:
        clock.phase_ended(phase, "s", None)


def test_the_models_reply_inside_a_note_request_is_not_the_keepers() -> None:
    hand = HandClock()
    clock = KeeperClock(hand)

    def note_request() -> None:
        hand.spend(0.25)
        _span(clock, "note_call", lambda: hand.spend(3.0))

    _span(clock, "note_request", note_request)
    assert clock.phases[MODEL] == pytest.approx(3.0)
    assert clock.keeper_phases()["note request"] == pytest.approx(0.25)
    assert clock.keeper == pytest.approx(0.25)


def test_every_span_the_keeper_reports_is_timed_in_one_of_the_clocks_phases() -> None:
    from keeper_middleware.phases import PHASES as SPANS_REPORTED

    assert set(SPANS) == set(SPANS_REPORTED)
    assert set(SPANS.values()) <= {*PHASES, MODEL}


def test_a_phase_that_raises_still_counts_and_leaves_the_stack_clean() -> None:
    hand = HandClock()
    clock = KeeperClock(hand)

    def failing() -> None:
        hand.spend(1.0)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        clock.timed("search", failing)()
    clock.timed("prepare", lambda: hand.spend(2.0))()
    assert clock.phases["search"] == pytest.approx(1.0)
    assert clock.phases["prepare"] == pytest.approx(2.0)


def test_an_async_phase_takes_out_what_its_worker_threads_timed() -> None:
    hand = HandClock()
    clock = KeeperClock(hand)
    prepare = clock.timed("prepare", lambda: hand.spend(0.75))

    async def step() -> None:
        hand.spend(0.25)
        await asyncio.to_thread(prepare)

    asyncio.run(clock.timed_async("rest", step)())
    assert clock.phases["prepare"] == pytest.approx(0.75)
    assert clock.phases["rest"] == pytest.approx(0.25)


def test_installing_listens_to_every_keeper_without_touching_its_class() -> None:
    from keeper_middleware import phases
    from keeper_middleware.keeper import Keeper

    before = dict(Keeper.__dict__)
    clock = KeeperClock()
    with clock.installed():
        assert phases.listened()
        assert dict(Keeper.__dict__) == before
    assert not phases.listened()
    assert set(clock.keeper_phases()) == set(PHASES)


def test_a_collection_inside_a_keeper_phase_is_timed_as_gc_and_not_as_the_phase() -> None:
    hand = HandClock()
    clock = KeeperClock(hand)

    def prepare() -> None:
        hand.spend(1.0)
        clock.collector_event("start", {})
        hand.spend(0.5)
        clock.collector_event("stop", {})

    clock.timed("prepare", prepare)()
    assert clock.phases["prepare"] == pytest.approx(1.0)
    assert clock.phases["gc"] == pytest.approx(0.5)
    assert clock.keeper == pytest.approx(1.5)


def test_a_collection_in_the_models_reply_or_outside_the_keeper_is_not_the_keepers() -> None:
    hand = HandClock()
    clock = KeeperClock(hand)

    def collect() -> None:
        clock.collector_event("start", {})
        hand.spend(2.0)
        clock.collector_event("stop", {})

    collect()
    _span(clock, "note_request", lambda: _span(clock, "note_call", collect))
    assert clock.phases["gc"] == 0.0
    assert clock.keeper == 0.0
    assert clock.phases[MODEL] == pytest.approx(2.0)


def test_installing_hooks_the_collector_only_while_installed() -> None:
    import gc

    clock = KeeperClock()
    with clock.installed():
        assert clock.collector_event in gc.callbacks
    assert clock.collector_event not in gc.callbacks
