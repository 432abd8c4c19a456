"""keeper-proxy in front of the scripted agent upstream, both on 127.0.0.1, as the front-door
and client tiers run them; and the checks those tiers share: every turn archived exactly once,
the NOTES written, a search answered and never shown to the client.

``coding_notes`` is the upstream's note-taker for a ``CodingSession``: the task's rule, then the
checksum of every file the noted turns read, in the keeper's change-line format.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keeper_middleware.integrations.proxy import create_proxy_app
from keeper_middleware.integrations.proxy.cli import serve_in_thread
from keeper_middleware.integrations.proxy.sessions.engine import KeeperProxy
from keeper_middleware.messages.facts import text_of
from tests.agent_upstream import API_READERS, AgentUpstream
from tests.coding_session import (
    CHECKSUM_LINE,
    SEARCH_TOOL,
    CodingSession,
    ToolCall,
    ToolResult,
    Turn,
)
from tests.proxy_upstream import FAST_RETRY

RULE = "report every checksum in capitals."


def coding_notes(turn: Turn) -> str:
    """Change lines for the turns being noted: the rule, and each file's checksum read."""
    lines = [f"RULE: {RULE}"]
    for item in turn.items:
        if isinstance(item, ToolResult):
            lines += [f"SET {m['name']} = {m['sum']}" for m in CHECKSUM_LINE.finditer(item.text)]
    return "\n".join(dict.fromkeys(lines))


@dataclass
class Stack:
    upstream: AgentUpstream
    url: str
    """keeper-proxy's ``/v1`` base URL."""
    app: Any

    @property
    def proxy(self) -> KeeperProxy:
        proxy: KeeperProxy = self.app.state.proxy
        return proxy

    @property
    def root(self) -> str:
        """The server root (Anthropic clients add ``/v1/messages`` themselves)."""
        return self.url.removesuffix("/v1")


@contextmanager
def keeper_stack(
    session: CodingSession, folder: Path, *, upstream_api: str, window: int, **options: Any
) -> Iterator[Stack]:
    """The scripted upstream and keeper-proxy in front of it, served on 127.0.0.1."""
    upstream = AgentUpstream(session, notes_reply=coding_notes)
    with upstream.serving() as upstream_url:
        options.setdefault("retry", FAST_RETRY)
        app = create_proxy_app(
            upstream_url,
            window=window,
            archive_dir=folder / "keeper",
            upstream_api=upstream_api,
            **options,
        )
        with serve_in_thread(app) as url:
            yield Stack(upstream, url, app)


def audit_session(stack: Stack, name: str) -> dict[str, int]:
    """Every turn the keeper archived is there once, and every tool result the client sent is
    archived or in view exactly once; returns counts for the caller's assertions."""
    keeper = stack.proxy.keeper
    turns = list(keeper.archive.turns(name))
    ids = [t.msg_id for t in turns]
    assert len(ids) == len(set(ids)), "a turn was archived twice"
    window = stack.proxy.record(name).window
    results: dict[str, int] = {}  # the client's tool results (not the proxy's searches)
    for turn in turns:
        if turn.tool_call_id and turn.name != SEARCH_TOOL:
            results[turn.tool_call_id] = results.get(turn.tool_call_id, 0) + 1
    for message in window:
        call_id = getattr(message, "tool_call_id", None)
        if call_id and message.name != SEARCH_TOOL:
            results[call_id] = results.get(call_id, 0) + 1
    twice = {k: v for k, v in results.items() if v > 1}
    assert not twice, f"tool results kept more than once: {twice}"
    texts = [t.content for t in turns] + [text_of(m) for m in window]
    assert not any("[NOTES REQUEST]" in t for t in texts[: len(turns)]), "a note request archived"
    return {
        "archived": len(turns),
        "results": len(results),
        "cuts": keeper.counters(name).cuts,
        "searches": keeper.counters(name).searches,
    }


def searches_answered(stack: Stack, api: str) -> list[str]:
    """The texts of the archive searches' results the upstream was sent (the proxy's)."""
    found: list[str] = []
    for recorded in stack.upstream.calls(api):
        items = API_READERS[api](recorded.body).items
        searched = {i.call_id for i in items if isinstance(i, ToolCall) and i.name == SEARCH_TOOL}
        found += [i.text for i in items if isinstance(i, ToolResult) and i.call_id in searched]
    return list(dict.fromkeys(found))


def mentions_search(payload: object) -> bool:
    """Whether anything a client received names the proxy's search tool."""
    return SEARCH_TOOL in json.dumps(payload)


LIMIT_FIELD = {"chat": "max_tokens", "responses": "max_output_tokens", "messages": "max_tokens"}


def check_upstream_shapes(stack: Stack, api: str) -> None:
    """The archive search was offered in the upstream API's own tool format on every work call,
    top level and never deferred; every note call was bounded by the reply reserve under that
    API's limit field."""
    reserve = stack.proxy.keeper.config.reserve
    calls = stack.upstream.calls(api)
    notes = [r for r in calls if API_READERS[api](r.body).is_note_call()]
    assert notes, "no note call reached the upstream"
    for recorded in calls:
        tools = recorded.body.get("tools") or []
        if api == "chat":
            named = [t for t in tools if t["function"]["name"] == SEARCH_TOOL]
            assert [t["type"] for t in named] == ["function"]
        elif api == "responses":
            named = [t for t in tools if t.get("name") == SEARCH_TOOL]
            assert [t["type"] for t in named] == ["function"] and "parameters" in named[0]
        else:
            named = [t for t in tools if t.get("name") == SEARCH_TOOL]
            assert len(named) == 1 and "input_schema" in named[0]
            assert "defer_loading" not in named[0]
    for recorded in notes:
        assert recorded.body[LIMIT_FIELD[api]] == reserve, recorded.body.get(LIMIT_FIELD[api])
