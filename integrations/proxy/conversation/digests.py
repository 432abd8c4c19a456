"""What identifies an agent message's content, for the keeper proxy (pure).

A message the proxy took in is recognised by its fingerprint (:func:`digest_of`) when the agent
sends it again, whatever the client changed in re-serialising it; a cheap per-process key
(:func:`message_key`) lets a resent message reuse its fingerprint without being read again.
"""

from __future__ import annotations

import hashlib
import json
import re
from itertools import repeat
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from keeper_middleware.messages.facts import text_of

__all__ = ["digest_of", "message_key"]

_TEXT_OR_NULL = (str, type(None))
_THINK_BLOCK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)
_CANONICAL = json.JSONEncoder(sort_keys=True, ensure_ascii=False, default=str)
"""``json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)``, the fingerprint's
text, without making an encoder for each message."""


def _plain_fields(raw: dict[str, Any], *, but: str) -> bool:
    """Whether every field of ``raw`` except ``but`` is a string or null (C speed: map())."""
    values = (v for k, v in raw.items() if k != but) if but in raw else raw.values()
    return all(map(isinstance, values, repeat(_TEXT_OR_NULL)))


def _call_key(call: object) -> tuple[Any, str, str] | None:
    """(id, name, arguments) of a tool call whose fields are all as they must be, else None."""
    if not isinstance(call, dict):
        return None
    function = call.get("function")
    if not isinstance(function, dict):
        return None
    name, arguments, call_id = function.get("name"), function.get("arguments"), call.get("id")
    if (
        type(name) is not str
        or type(arguments) is not str
        or not isinstance(call_id, _TEXT_OR_NULL)
    ):
        return None
    return call_id, name, arguments


def message_key(raw: object) -> int | None:
    """Python's hash of everything a message's fingerprint and conversion depend on, for a
    message that cannot fail to convert (every field as it must be), else None.

    Such a message is converted only when first needed (:class:`~.chat_request.LazyMessages`):
    an agent resends its whole history on every call, its tool calls and tool results included,
    and the proxy needs only the new messages as LangChain messages. Equal fields, equal key;
    it is computed at C speed and lives only in the process's memory (Python seeds it per
    process), never in the archive. Reusing a wrong fingerprint would take a 64-bit collision
    at the same position of the same session.
    """
    if not isinstance(raw, dict):
        return None
    role = raw.get("role")
    if role == "tool":
        call_id = raw.get("tool_call_id")
        if type(call_id) is not str or not call_id or not _plain_fields(raw, but=""):
            return None
        return hash((role, raw.get("content") or "", call_id))
    if role not in ("user", "assistant"):
        return None
    calls = raw.get("tool_calls")
    if calls is None:
        if not _plain_fields(raw, but=""):
            return None
        return hash((role, raw.get("content") or ""))
    if role != "assistant" or type(calls) is not list or not _plain_fields(raw, but="tool_calls"):
        return None
    keys = tuple(map(_call_key, calls))
    if None in keys:
        return None
    return hash((role, raw.get("content") or "", keys))


def digest_of(message: BaseMessage) -> str:
    """A fingerprint of what an agent message says, stable across re-serialisation.

    It ignores what clients change when they send a message back (null vs "" content, spacing in
    tool arguments, reasoning fields, think blocks, surrounding whitespace), so the reply the proxy
    returned is recognised when the agent sends it back.
    """
    content: Any = message.content
    if isinstance(content, list) and all(
        isinstance(p, str) or (isinstance(p, dict) and p.get("type") == "text") for p in content
    ):
        content = text_of(message)
    if isinstance(content, str):
        content = _THINK_BLOCK.sub("", content).strip()
    canonical: dict[str, Any] = {"role": message.type, "content": content}
    if isinstance(message, AIMessage):
        canonical["calls"] = [[c["id"], c["name"], c["args"]] for c in message.tool_calls]
        canonical["invalid"] = [[c["id"], c["name"], c["args"]] for c in message.invalid_tool_calls]
    if isinstance(message, ToolMessage):
        canonical["call_id"] = message.tool_call_id
    text = _CANONICAL.encode(canonical)
    return hashlib.sha256(text.encode()).hexdigest()[:20]
