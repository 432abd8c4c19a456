"""The benchmark's servers, each in its own process: an instant upstream, and the keeper proxy.

Kept apart from the measuring (``cost.py``, ``vs_direct.py``) because both
benchmarks start the same processes and read the same ``/proc`` figures from them. A server
process is ``python -m keeper_bench.proxy.cost --serve-proxy/--serve-upstream``
(that command's hidden options call ``serve_proxy`` and ``serve_upstream`` here), so its CPU
time and memory are its own, not the agents'. ``proxy-overhead`` also starts the bare relay, the
fair and keeping floors (``relay_process``, ``keeping_process``) and the ``keeper-proxy`` command
itself (``keeper_proxy_process``) from here.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

NOTE_MARKERS = ("[NOTES REQUEST]", "[NOTES CHECK]")
READ_NEXT = "read_next"
"""The tool an agent in its tool loop calls for its next input."""
BODY_LIMIT = 512 * 1024 * 1024


# -- the instant upstream -----------------------------------------------------------------------
def instant_completion(text: str, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A whole chat completion whose reply is ``text`` (and ``calls``, when given)."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message = {"role": "assistant", "content": None, "tool_calls": calls}
    return {
        "id": "instant",
        "object": "chat.completion",
        "created": 0,
        "model": "instant",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if calls else "stop",
            }
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 1, "total_tokens": 1},
    }


def instant_reply(body: dict[str, Any]) -> str:
    """``NO CHANGES`` to a note request, a fixed line to a work call."""
    messages = body.get("messages") or [{}]
    last = messages[-1].get("content") or ""
    if isinstance(last, str) and last.startswith(NOTE_MARKERS):
        return "NO CHANGES"
    return "1. noted"


def instant_answer(body: dict[str, Any]) -> dict[str, Any]:
    """The instant upstream's completion: to a work call that offers ``read_next``, a call of it
    (an agent in its tool loop); otherwise :func:`instant_reply`."""
    text = instant_reply(body)
    offered = [t.get("function", {}).get("name") for t in body.get("tools") or []]
    if text == "NO CHANGES" or READ_NEXT not in offered:
        return instant_completion(text)
    call = {
        "id": f"call_{len(body.get('messages') or ())}",
        "type": "function",
        "function": {"name": READ_NEXT, "arguments": "{}"},
    }
    return instant_completion("", [call])


def instant_upstream_app(delay: float = 0.0) -> Starlette:
    """The upstream; with ``delay``, every chat reply waits that many seconds first (a model
    server's time to answer, spent asleep: it costs no CPU)."""

    async def chat(request: Request) -> Response:
        reply = instant_answer(json.loads(await request.body()))
        if delay:
            await asyncio.sleep(delay)
        return JSONResponse(reply)

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "instant"}]})

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
        ]
    )


# -- the proxy in its own process ---------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True, slots=True)
class ProxyProcess:
    pid: int
    url: str

    def cpu_seconds(self) -> float:
        """CPU time of all the process's threads: in nanoseconds from each thread's
        ``schedstat`` where the kernel keeps it, else in clock ticks (10 ms) from ``stat``."""
        try:
            tasks = Path(f"/proc/{self.pid}/task").iterdir()
            return sum(int((t / "schedstat").read_text().split()[0]) for t in tasks) / 1e9
        except (OSError, ValueError, IndexError):
            pass
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / ticks

    def loop_cpu_seconds(self) -> float:
        """CPU time of the process's main thread alone (the event loop's, in a server), read as
        :meth:`cpu_seconds` reads each thread's."""
        task = Path(f"/proc/{self.pid}/task/{self.pid}")
        try:
            return int((task / "schedstat").read_text().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            pass
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def memory_mb(self) -> tuple[float, float]:
        """(resident now, peak resident) in MB."""
        status = dict(
            line.split(":", 1) for line in Path(f"/proc/{self.pid}/status").read_text().splitlines()
        )
        return int(status["VmRSS"].split()[0]) / 1024, int(status["VmHWM"].split()[0]) / 1024


@contextmanager
def _child(argument: str, spec: str) -> Iterator[tuple[int, str]]:
    """This module run as a server process; yields (pid, base URL without /v1)."""
    port = free_port()
    filled = spec.replace("{port}", str(port))
    command = [sys.executable, "-m", "keeper_bench.proxy.cost", argument, filled]
    with spawn(command, port, pinned=argument != "--serve-upstream") as started:
        yield started


_PINNED: list[int] = []
"""The CPU the measured servers are kept on (:func:`pinned_servers`), if any."""


@contextmanager
def pinned_servers(cpu: int | None) -> Iterator[None]:
    """Within this block, every server :func:`spawn` starts keeps its threads on ``cpu``, as
    ``keeper-proxy --cpu`` does (None: wherever the OS puts them). The relays and both
    keeper-proxies are pinned alike, so none of them is measured on better terms."""
    if cpu is None:
        yield
        return
    _PINNED.append(cpu)
    try:
        yield
    finally:
        _PINNED.pop()


def _pin_child() -> None:  # in the child, before it runs the server's code
    os.sched_setaffinity(0, {_PINNED[-1]})


@contextmanager
def spawn(
    command: Sequence[str], port: int, cwd: Path | None = None, *, pinned: bool = True
) -> Iterator[tuple[int, str]]:
    """``command`` as a server process that will listen on ``port`` (run in ``cwd``: a
    ``python -m`` there imports that checkout's code); yields (pid, base URL without /v1) once
    ``GET /v1/models`` answers, and stops it after. ``pinned=False``: never kept on the CPU of
    :func:`pinned_servers` (the upstream, which is not measured, must not take turns with the
    server that is)."""
    child = subprocess.Popen(
        list(command),
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        cwd=cwd,
        preexec_fn=_pin_child if _PINNED and pinned else None,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/v1/models", timeout=2).status_code < 500:
                    break
            except httpx.TransportError:
                pass
            if child.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{' '.join(command)} did not start")
            time.sleep(0.1)
        yield child.pid, url
    finally:
        child.terminate()
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:  # still draining its index: its figures are taken
            child.kill()
            child.wait(timeout=30)


@contextmanager
def proxy_process(upstream: str, window: int, archive: Path) -> Iterator[ProxyProcess]:
    with _child("--serve-proxy", f"{upstream} {window} {{port}} {archive}") as (pid, url):
        yield ProxyProcess(pid, url)


@contextmanager
def upstream_server(delay: float = 0.0) -> Iterator[ProxyProcess]:
    """The instant upstream in its own process (its pid, for its CPU time; its URL without /v1);
    ``delay``: seconds each reply waits."""
    with _child("--serve-upstream", f"{{port}} {delay}") as (pid, url):
        yield ProxyProcess(pid, url)


@contextmanager
def upstream_process() -> Iterator[str]:
    """The instant upstream in its own process, so the agents' load does not slow it."""
    with upstream_server() as server:
        yield f"{server.url}/v1"


def serve_upstream(spec: str) -> None:
    """``PORT`` or ``PORT DELAY_SECONDS``."""
    import uvicorn

    port, _, delay = spec.partition(" ")
    app = instant_upstream_app(float(delay or 0))
    uvicorn.run(app, host="127.0.0.1", port=int(port), log_level="warning", access_log=False)


def serve_proxy(spec: str) -> None:
    import uvicorn

    from keeper_middleware.integrations.proxy import create_proxy_app

    upstream, window, port, archive = spec.split(" ", 3)
    app = create_proxy_app(
        upstream, window=int(window), archive_dir=Path(archive), max_body_bytes=BODY_LIMIT
    )
    uvicorn.run(app, host="127.0.0.1", port=int(port), log_level="warning")


# -- the relays and keeper-proxy the measurements start ------------------------------------------
@contextmanager
def relay_process(
    upstream: ProxyProcess, floor: Path | None = None, keeping: Path | None = None
) -> Iterator[ProxyProcess]:
    """The bare relay; with ``floor`` the fair floor, committing a row a request to that file;
    with ``keeping`` the keeping floor, keeping each new turn and its reply in that file (each
    file emptied first, its path made absolute)."""
    port = free_port()
    command = [sys.executable, "-m", "keeper_bench.proxy.relay"]
    command += ["--upstream", upstream.url, "--port", str(port)]
    for option, path in (("--floor", floor), ("--keeping", keeping)):
        if path is not None:
            path = path.resolve()
            path.unlink(missing_ok=True)
            path.parent.mkdir(parents=True, exist_ok=True)
            command += [option, str(path)]
    with spawn(command, port) as (pid, url):
        yield ProxyProcess(pid, url)


def keeping_process(upstream: ProxyProcess, rows: Path) -> AbstractContextManager[ProxyProcess]:
    """The keeping floor (:class:`~keeper_bench.proxy.relay.KeepingFloor`), its rows in
    ``rows``."""
    return relay_process(upstream, keeping=rows)


@contextmanager
def keeper_proxy_process(
    upstream: ProxyProcess, window: int, archive: Path, checkout: Path | None = None
) -> Iterator[ProxyProcess]:
    """The ``keeper-proxy`` command itself, as a user starts it (``checkout``: that source
    tree's code instead of the installed one, to measure two versions side by side). The
    archive's path is made absolute first: a relative one would be emptied here but opened in
    the checkout by the child, which would then start from an earlier run's sessions."""
    archive = archive.resolve()
    shutil.rmtree(archive, ignore_errors=True)
    port = free_port()
    command = [sys.executable, "-m", "keeper_middleware.integrations.proxy"]
    command += ["--upstream", f"{upstream.url}/v1", "--window", str(window), "--port", str(port)]
    command += ["--archive-dir", str(archive), "--log-level", "warning", "--max-body-mb", "512"]
    with spawn(command, port, cwd=checkout) as (pid, url):
        yield ProxyProcess(pid, url)
