"""The replica launcher of the scale-out benchmark says why a replica did not start, and a
replica still starting when the group is stopped is not left running."""

from __future__ import annotations

import threading
import time

import pytest

from keeper_bench.replicas import Replicas


def test_a_replica_that_exits_at_start_is_retried_then_reported_with_what_it_printed():
    group = Replicas(1, "http://127.0.0.1:9/v1", "postgresql://nobody@127.0.0.1:1/none", 0)
    try:
        with pytest.raises(RuntimeError, match="window=0 is too small") as raised:
            group.start(0)
        assert "exit code 2" in str(raised.value)
    finally:
        group.stop()


def test_stopping_the_group_ends_a_start_in_progress_without_an_error():
    # no database answers at this address: the replica is stopped before it could come up
    group = Replicas(1, "http://127.0.0.1:9/v1", "postgresql://nobody@127.0.0.1:1/none", 4096)
    failures: list[BaseException] = []

    def start() -> None:
        try:
            group.start(0)
        except BaseException as failure:
            failures.append(failure)

    starting = threading.Thread(target=start)
    starting.start()
    while group.children[0] is None and starting.is_alive():
        time.sleep(0.01)
    group.stop()
    starting.join(timeout=60)
    assert not starting.is_alive()
    assert not failures
    child = group.children[0]
    assert child is None or child.poll() is not None, "no replica is left running"
