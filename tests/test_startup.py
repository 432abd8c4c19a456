"""``freeze_startup_objects`` and ``collect_young_less_often``: what a long-running host does once
start-up is over."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import weakref

import pytest

import keeper_middleware
from keeper_middleware.errors import ConfigurationError


def test_what_lived_at_start_up_is_frozen_and_what_comes_after_is_still_collected():
    # in a process of its own: a frozen object is never collected, so pytest's must stay unfrozen
    script = textwrap.dedent(
        """
        import gc, weakref
        import keeper_middleware
        class Node:
            pass
        early = Node()
        early.self = early  # a cycle alive at start-up
        frozen = keeper_middleware.freeze_startup_objects()
        assert frozen == gc.get_freeze_count() > 10_000, frozen
        assert not any(o is early for o in gc.get_objects())  # no longer walked
        later = Node()
        later.self = later
        gone = weakref.ref(later)
        del later
        gc.collect()
        assert gone() is None  # garbage made after start-up is collected as before
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    assert gc.get_freeze_count() == 0  # this process was left alone


class _Node:
    self: _Node


def test_a_raised_young_threshold_keeps_the_older_generations_and_still_collects_cycles():
    before = gc.get_threshold()
    try:
        now = keeper_middleware.collect_young_less_often(50_000)
        assert now == (50_000, before[1], before[2])
        cycle = _Node()
        cycle.self = cycle
        gone = weakref.ref(cycle)
        del cycle
        gc.collect()
        assert gone() is None
    finally:
        gc.set_threshold(*before)


def test_a_young_threshold_below_one_is_a_configuration_error():
    before = gc.get_threshold()
    with pytest.raises(ConfigurationError, match="at least 1"):
        keeper_middleware.collect_young_less_often(0)
    assert gc.get_threshold() == before
