"""``freeze_startup_objects``: what a long-running host does once start-up is over."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap


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
