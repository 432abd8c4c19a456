"""The keeper as an OpenAI-compatible proxy in front of a model server.

An agent that sends its whole history on every call and manages nothing points its base URL here.
For each ``POST /v1/chat/completions`` the proxy aligns the agent's messages with its session by
content (:mod:`.history`), runs the keeper step before every upstream call, sends the upstream at
most the live window, answers the model's archive searches itself, and returns (or streams) the
reply. The engine is the same ``Keeper`` the LangGraph node drives. One package per concern
(docs/architecture.md has the map): ``conversation`` (the one internal form every API is read
into), ``chat_completions``, ``responses`` and ``messages`` (each API's requests, replies and
stream events, front and upstream side), ``upstream`` (the HTTP client and the upstream's API),
``sessions`` (tenants, session records, the engine), ``slots`` (llama.cpp slot parking),
``doors`` (the Responses and Messages routes); the server (:mod:`.app`, :mod:`.cli`,
:mod:`.serving`) is at the top.

    keeper-proxy --upstream http://127.0.0.1:8000/v1 --window 32768
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from keeper_middleware.integrations.proxy.app import (
        ARCHIVE_FILE,
        create_proxy_app,
        session_report,
    )
    from keeper_middleware.integrations.proxy.sessions.engine import KeeperProxy
    from keeper_middleware.integrations.proxy.sessions.tenants import Tenants
    from keeper_middleware.integrations.proxy.upstream.client import (
        RetryPolicy,
        Upstream,
        UpstreamError,
    )

__all__ = [
    "ARCHIVE_FILE",
    "KeeperProxy",
    "RetryPolicy",
    "Tenants",
    "Upstream",
    "UpstreamError",
    "create_proxy_app",
    "session_report",
]

_HOMES = {
    "ARCHIVE_FILE": "app",
    "create_proxy_app": "app",
    "session_report": "app",
    "KeeperProxy": "sessions.engine",
    "Tenants": "sessions.tenants",
    "RetryPolicy": "upstream.client",
    "Upstream": "upstream.client",
    "UpstreamError": "upstream.client",
}


def __getattr__(name: str) -> Any:
    """Imported on first use, so ``keeper-proxy --help`` and ``serve_in_thread`` work without
    the web server's packages loaded."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"{__name__}.{_HOMES[name]}"), name)
