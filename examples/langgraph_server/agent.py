"""The keeper agent for ``langgraph dev`` (or any LangGraph server): ``langgraph.json`` beside
this file points at ``agent``.

    pip install -e "../..[server]"   # from this folder: langgraph-cli[inmem] and the keeper
    KEEPER_MODEL=openai:gpt-4o-mini langgraph dev

The server brings its own checkpointer (threads persist there); the keeper's archive is the file
``KEEPER_ARCHIVE``, by default ``$XDG_STATE_HOME/keeper-middleware/langgraph_server/archive.sqlite3``
(``~/.local/state/...``): outside this folder, which ``langgraph dev`` watches and reloads on
change. An archive you place in this folder (``KEEPER_ARCHIVE=.keeper/archive.sqlite3``) needs
``langgraph dev --no-reload``; ``.keeper/`` is in ``.gitignore``. Without ``KEEPER_MODEL`` a scripted stand-in (``keeper_middleware.testing``)
plays the model, so the graph loads and runs with no key and no network. Note calls never reach the server's message stream,
and the async path never blocks the server's event loop.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage

from keeper_middleware import KeeperConfig, create_keeper_agent
from keeper_middleware.messages.facts import keeper_kind, text_of
from keeper_middleware.testing import ScriptedChatModel, tool_call


def stand_in(messages: list[BaseMessage]) -> AIMessage | str:
    """Offline: no notes of its own; a question about a register is searched in the archive
    and answered from the result."""
    if keeper_kind(messages[-1]) in ("notes_request", "notes_reask"):
        return "NO CHANGES"
    last = [m for m in messages if keeper_kind(m) is None][-1]
    if last.type == "tool":
        found = re.search(r"recorded (\w+) at (\d+)", text_of(last))
        return f"1. {found.group(2)}" if found else "1. unknown"
    asked = re.search(r"What value does (\w+) hold", text_of(last))
    if asked:
        return tool_call("search_archive", query=asked.group(1))
    return "Read."


def _model() -> BaseChatModel | str:
    name = os.environ.get("KEEPER_MODEL", "").strip()
    if name:
        return name  # any init_chat_model string, e.g. "openai:gpt-4o-mini"
    return ScriptedChatModel(default=stand_in)


def default_archive() -> Path:
    """Where the archive lives unless ``KEEPER_ARCHIVE`` says: the user's state folder, never
    the app folder the dev server watches (a write there would set off a reload)."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "keeper-middleware" / "langgraph_server" / "archive.sqlite3"


def _archive() -> Path:
    path = Path(os.environ.get("KEEPER_ARCHIVE") or default_archive())
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


agent: Any = create_keeper_agent(
    _model(),
    system_prompt="You read stories and answer questions about them.",
    config=KeeperConfig(window=int(os.environ.get("KEEPER_WINDOW", "8192"))),
    archive=_archive(),
    name="keeper_agent",
)
