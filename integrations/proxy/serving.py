"""How the proxy is served: uvicorn, with a deadline for reading a request's headers.

uvicorn closes a keep-alive connection that stays idle, but a connection that sends its request
headers slowly (a byte every few seconds: "slowloris") is never closed, and a few hundred of them
hold as many sockets and file descriptors for as long as they like. Here every request's headers
must arrive within ``header_timeout`` seconds, counted from the connection's opening or, on a
kept-alive connection, from the first byte of the next request; a connection past it is closed.
The body is the application's to read (the proxy caps its size).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from keeper_middleware.errors import ConfigurationError, ServerStartError

__all__ = [
    "DEFAULT_HEADER_TIMEOUT",
    "header_deadline",
    "http_protocol",
    "pin_to_cpu",
    "serve_in_thread",
    "uvicorn_config",
]

DEFAULT_HEADER_TIMEOUT = 20.0
"""Seconds a client has to send a request's headers (nginx allows 60, Apache 20 to 40)."""

_log = logging.getLogger(__name__)


def header_deadline(base: type[asyncio.Protocol], seconds: float) -> type[asyncio.Protocol]:
    """``base`` (one of uvicorn's HTTP/1.1 protocols) with a deadline for each request's
    headers. Both of uvicorn's parsers start a request cycle (``self.cycle``) the moment the
    headers are complete, so the deadline is cleared when a new cycle appears."""
    if seconds <= 0:
        raise ConfigurationError(
            f"the header timeout must be a positive number of seconds, not {seconds}"
        )

    class HeaderDeadline(base):  # type: ignore[valid-type,misc]
        _deadline: asyncio.TimerHandle | None = None
        _waiting_cycle: Any = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            cycle = getattr(self, "cycle", None)
            if self._deadline is None and (cycle is None or cycle.response_complete):
                self._arm()  # the first byte of the next request on a kept-alive connection
            super().data_received(data)
            if self._deadline is not None and getattr(self, "cycle", None) is not (
                self._waiting_cycle
            ):
                self._disarm()  # the headers are complete: the request is the app's now

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._waiting_cycle = getattr(self, "cycle", None)
            self._deadline = asyncio.get_running_loop().call_later(seconds, self._expired)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self) -> None:
            self._deadline = None
            transport = getattr(self, "transport", None)
            if transport is not None and not transport.is_closing():
                _log.info("closed a connection that sent no complete headers in %g s", seconds)
                transport.close()

    HeaderDeadline.__name__ = HeaderDeadline.__qualname__ = f"HeaderDeadline{base.__name__}"
    return HeaderDeadline


def http_protocol(header_timeout: float = DEFAULT_HEADER_TIMEOUT) -> type[asyncio.Protocol]:
    """uvicorn's automatic choice of HTTP/1.1 parser (httptools when installed, else h11), with
    the header deadline: what ``uvicorn.run(..., http=...)`` takes."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    return header_deadline(AutoHTTPProtocol, header_timeout)


def uvicorn_config(
    app: Any,
    *,
    host: str,
    port: int,
    header_timeout: float = DEFAULT_HEADER_TIMEOUT,
    log_level: str = "warning",
    access_log: bool = False,
    lifespan: Literal["on", "off", "auto"] = "on",
) -> Any:
    """A ``uvicorn.Config`` for the proxy: its automatic choice of HTTP parser (httptools when
    installed, else h11) with the header deadline; uvloop when installed."""
    import uvicorn

    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=http_protocol(header_timeout),
        log_level=log_level,
        access_log=access_log,
        lifespan=lifespan,
    )


def pin_to_cpu(cpu: int) -> None:
    """Keep this process's threads on one CPU (``taskset -c CPU``); call it before any thread
    starts, so that every thread started after inherits it.

    The proxy's Python work runs one thread at a time (the interpreter's lock), on the event loop
    and in its worker threads, which hand the lock back and forth at every request. With the
    threads free to run on two cores, each hand-off wakes a thread on the other core, which
    finds the lock taken and sleeps again: at 32 sessions at once about 15 context switches a
    request, and 30-40% more CPU a request than with the threads on one core, where the lock
    changes hands without waking anyone (``bench/results/proxy_overhead.md``). Unpinned, the
    scheduler sometimes places them together and sometimes apart, so the cost varies from run
    to run. Pinned, the OS can no longer move the proxy off a CPU that another process keeps
    busy: pick one that is free.

    Args:
        cpu: the CPU's number, one this process may run on (``os.sched_getaffinity(0)``).

    Raises:
        ConfigurationError: the platform cannot pin threads, or ``cpu`` is not one this process
            may run on.
    """
    if not hasattr(os, "sched_setaffinity"):
        raise ConfigurationError("pinning to a CPU needs Linux (os.sched_setaffinity)")
    allowed = sorted(os.sched_getaffinity(0))
    if cpu not in allowed:
        raise ConfigurationError(
            f"CPU {cpu} is not one this process may run on (allowed: "
            f"{', '.join(map(str, allowed))})"
        )
    os.sched_setaffinity(0, {cpu})


@contextmanager
def serve_in_thread(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    lifespan: Literal["on", "off"] = "on",
    header_timeout: float = DEFAULT_HEADER_TIMEOUT,
) -> Iterator[str]:
    """Serve an ASGI app (the proxy) with uvicorn in a background thread, as ``keeper-proxy``
    serves it (:func:`~.serving.uvicorn_config`); yields its ``/v1`` base URL. Port 0 picks a
    free port. For benchmarks and tests that need a real socket; ``lifespan="off"`` skips the
    shutdown hook, as a killed process would.
    """
    import uvicorn

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound = sock.getsockname()[1]
    config = uvicorn_config(
        app, host=host, port=bound, header_timeout=header_timeout, lifespan=lifespan
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise ServerStartError(f"the server did not start on {host}:{bound}")
            time.sleep(0.01)
        shown = f"[{host}]" if ":" in host else host
        yield f"http://{shown}:{bound}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        sock.close()
