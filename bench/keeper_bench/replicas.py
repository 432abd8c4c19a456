"""``keeper-proxy`` replicas on one database, each in its own process on its own port.

Kept apart from the traffic (``scale_out.py``) because this is process management: start a
replica and wait until it answers, SIGKILL one mid-cut, restart it on the same port, stop them all.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Replicas:
    """``keeper-proxy`` processes on one database, each on its own port."""

    def __init__(self, count: int, upstream: str, database: str, window: int) -> None:
        self.upstream, self.database, self.window = upstream, database, window
        self.ports = [free_port() for _ in range(count)]
        self.children: list[subprocess.Popen[bytes] | None] = [None] * count
        self.down: set[int] = set()
        self.logs = tempfile.TemporaryDirectory(prefix="keeper-replicas-")  # removed with self
        self.stopped = False
        self._spawning = threading.Lock()  # a restart on another thread never outlives stop()

    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.ports]

    def start(self, number: int) -> None:
        """Start replica ``number`` and wait until it answers.

        A restart binds the port the killed replica held; if the child exits before it answers
        (the port not yet free, say), it is started again, up to three times, and then the error
        carries what the child printed.
        """
        why = ""
        for attempt in range(3):
            if attempt:
                time.sleep(1.0)
            spawned = self._spawn(number)
            if spawned is None:  # the group was stopped
                return
            child, log = spawned
            if self._answers(number, child):
                self.down.discard(number)
                return
            if child.poll() is None:  # hung, or the group was stopped: no retry
                child.kill()
                child.wait(timeout=30)
                if self.stopped:
                    return
            printed = log.read_text("utf-8", "replace")[-2000:]
            why = f"exit code {child.returncode}; it printed:\n{printed}"
            if child.returncode == -signal.SIGKILL:
                break
        raise RuntimeError(f"replica {number} did not start: {why}")

    def _answers(self, number: int, child: subprocess.Popen[bytes]) -> bool:
        """Whether the replica answers within two minutes (False once it exits or on stop)."""
        deadline = time.monotonic() + 120
        while child.poll() is None and time.monotonic() < deadline and not self.stopped:
            try:
                httpx.get(f"{self.urls()[number]}/metrics", timeout=2)
            except httpx.TransportError:
                time.sleep(0.1)
                continue
            return True
        return False

    def _spawn(self, number: int) -> tuple[subprocess.Popen[bytes], Path] | None:
        command = [
            sys.executable,
            "-m",
            "keeper_middleware.integrations.proxy",
            "--upstream",
            self.upstream,
            "--window",
            str(self.window),
            "--port",
            str(self.ports[number]),
            "--archive-url",
            self.database,
        ]
        log = Path(self.logs.name) / f"replica-{number}.log"
        with self._spawning, log.open("wb") as printed:
            if self.stopped:
                return None
            child = self.children[number] = subprocess.Popen(
                command,
                env={**os.environ, "HF_HUB_OFFLINE": "1"},
                stdout=printed,
                stderr=subprocess.STDOUT,
            )
        return child, log

    def kill(self, number: int) -> None:
        child = self.children[number]
        if child is not None:
            self.down.add(number)
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)

    def stop(self) -> None:
        with self._spawning:
            self.stopped = True
        for child in self.children:
            if child is not None and child.poll() is None:
                child.terminate()
                child.wait(timeout=30)
