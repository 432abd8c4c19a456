"""The keeper agent for ``langgraph dev`` (or any LangGraph server): ``langgraph.json`` beside
this file points at ``agent``.

    pip install -e "../..[server]"   # from this folder: langgraph-cli[inmem] and the keeper
    KEEPER_MODEL=openai:gpt-4o-mini langgraph dev

The server brings its own checkpointer (threads persist there); the keeper's archive is the file
``KEEPER_ARCHIVE``. Without ``KEEPER_MODEL`` the offline simulated reader answers, so the graph
loads and runs with no key and no network. Note calls never reach the server's message stream,
and the async path never blocks the server's event loop.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel

from keeper_middleware import KeeperConfig, create_keeper_agent


def _model() -> BaseChatModel | str:
    name = os.environ.get("KEEPER_MODEL", "").strip()
    if name:
        return name  # any init_chat_model string, e.g. "openai:gpt-4o-mini"
    from keeper_middleware.bench.reader import SimulatedReader

    return SimulatedReader()


def _archive() -> Path:
    path = Path(os.environ.get("KEEPER_ARCHIVE") or ".keeper/archive.sqlite3")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


agent: Any = create_keeper_agent(
    _model(),
    system_prompt="You read stories and answer questions about them.",
    config=KeeperConfig(window=int(os.environ.get("KEEPER_WINDOW", "8192"))),
    archive=_archive(),
    name="keeper_agent",
)
