"""The one form every API's request is read into, for the keeper proxy (pure).

A client's request, whatever API it came through, becomes a :class:`ChatRequest`: the system
prompt, the agent's history as LangChain messages (what the keeper engine works on), its tools
and every other field untouched. What goes wrong reading it is a :class:`RequestError`, answered
in the API's error shape. Reading Chat Completions JSON is :mod:`.chat_request`; one message
either way is :mod:`.chat_messages`; fingerprints are :mod:`.digests`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import BaseMessage

from keeper_middleware.errors import KeeperError
from keeper_middleware.integrations.proxy.conversation.digests import digest_of
from keeper_middleware.integrations.proxy.conversation.resent import Fingerprints
from keeper_middleware.search.schema import (
    SEARCH_TOOL_DESCRIPTION,
    SEARCH_TOOL_NAME,
    SEARCH_TOOL_PARAMETERS,
)

__all__ = [
    "OWN_FIELDS",
    "SEARCH_TOOL_SCHEMA",
    "WIRE_KEY",
    "ChatRequest",
    "RequestError",
    "error_body",
]

SEARCH_TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": SEARCH_TOOL_NAME,
        "description": SEARCH_TOOL_DESCRIPTION,
        "parameters": SEARCH_TOOL_PARAMETERS,
    },
}
WIRE_KEY = "keeper_wire"
"""Where a message, or a reply read from a Responses or Messages upstream, carries the items of
the API it came through (:mod:`.wire`); never sent to a chat model or a chat client."""
OWN_FIELDS = ("messages", "tools", "stream", "stream_options")
"""A Chat Completions request's fields the proxy reads itself; every other is forwarded."""


class RequestError(KeeperError, ValueError):
    """A request the proxy cannot take; answered with a 4xx in OpenAI's error shape."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status


def error_body(
    message: str,
    *,
    kind: str = "invalid_request_error",
    code: str | None = None,
    param: str | None = None,
) -> dict[str, Any]:
    """OpenAI's error shape, which both the official client and LangChain read."""
    return {"error": {"message": message, "type": kind, "code": code, "param": param}}


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatRequest:
    """An agent's chat request, read and checked."""

    system_prompt: str | None
    """The leading system (or developer) messages, joined: the keeper renders it on every call."""
    messages: Sequence[BaseMessage]
    """The agent's history after the system prompt, without ids (the proxy assigns them).
    Plain messages are converted when first read (:class:`~.chat_request.LazyMessages`)."""
    tools: tuple[dict[str, Any], ...]
    """The agent's own tool schemas, untouched."""
    stream: bool
    include_usage: bool
    params: Mapping[str, Any]
    """Every other field (model, temperature, unknown ones), forwarded untouched."""
    keys: tuple[int | None, ...] = ()
    """A cheap key per message (:func:`~.digests.message_key`), so fingerprints can be reused
    by position."""
    api: str = "chat"
    """The API the client spoke: ``chat``, ``responses`` or ``messages``."""
    context: Any = None
    """What the front door read besides the neutral request (a :class:`~.wire.WireContext`;
    None for Chat Completions)."""
    given_digests: tuple[str, ...] = ()
    """The messages' fingerprints, when the front door computed them already."""
    continues: str | None = None
    """For a request that sends only what follows a response of the session (Responses'
    ``previous_response_id``): the id that response's reply has in the session. The request is
    refused unless that reply is still the last message the session took in."""
    reply_id: str | None = None
    """The id to give this request's final reply in the session (instead of a fresh one)."""
    keep_dropped: bool = False
    """Messages taken in earlier that this request no longer carries stay where they are (in
    view, or archived), instead of being withdrawn: the client compacted its own history."""
    raw: Sequence[Any] = ()
    """The request's ``messages`` as parsed JSON (Chat Completions), kept with the session so
    the next request's resent part is confirmed in one comparison (:mod:`.resent`)."""
    resent_pairs: Fingerprints = ()
    """(key, fingerprint) of the leading messages confirmed to be the session's last request's:
    they were not checked, keyed or fingerprinted again."""

    @property
    def digests(self) -> tuple[str, ...]:
        if len(self.given_digests) == len(self.messages):
            return self.given_digests
        return tuple(digest_of(m) for m in self.messages)

    def digests_reusing(
        self, previous: Sequence[tuple[int | None, str]]
    ) -> tuple[tuple[int | None, str], ...]:
        """(key, fingerprint) per message, taking the fingerprint from ``previous`` wherever the
        same position holds a message with the same key. An agent resends its whole history on
        every call; fingerprinting only what changed keeps a request's cost from growing with it."""
        if len(self.keys) != len(self.messages):
            return tuple((None, d) for d in self.digests)
        pairs = list(self.resent_pairs)
        keys = self.keys
        for position in range(len(pairs), len(keys)):
            key = keys[position]
            known = previous[position] if position < len(previous) else None
            if key is not None and known is not None and known[0] == key:
                pairs.append(known)
            else:
                pairs.append((key, digest_of(self.messages[position])))
        return tuple(pairs)
