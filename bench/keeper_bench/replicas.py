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
import time

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

    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.ports]

    def start(self, number: int) -> None:
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
        self.children[number] = subprocess.Popen(
            command,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 120
        while True:
            try:
                httpx.get(f"{self.urls()[number]}/metrics", timeout=2)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"replica {number} did not start") from None
                time.sleep(0.1)
        self.down.discard(number)

    def kill(self, number: int) -> None:
        child = self.children[number]
        if child is not None:
            self.down.add(number)
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)

    def stop(self) -> None:
        for child in self.children:
            if child is not None and child.poll() is None:
                child.terminate()
                child.wait(timeout=30)
