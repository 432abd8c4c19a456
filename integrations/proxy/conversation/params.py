"""A request's settings, from the API a client speaks to the API the upstream speaks (pure).

Between the same APIs every field passes as it came, unknown ones included (a client's beta
field is the upstream's business). Between different APIs only fields with a meaning on both
sides cross, renamed where the APIs name them differently; everything else stays behind (logged
once per field), since a local server may refuse what it does not know. Chat Completions is the
middle: a field goes from the client's API to chat, then from chat to the upstream's.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

__all__ = ["translate_params"]

_log = logging.getLogger(__name__)
_warned: set[tuple[str, str, str]] = set()

_CHAT_COMMON = ("model", "temperature", "top_p", "user", "metadata", "seed", "parallel_tool_calls")
_CHAT_KNOWN = (
    *_CHAT_COMMON,
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "tool_choice",
    "reasoning_effort",
    "frequency_penalty",
    "presence_penalty",
    "top_k",
    "response_format",
    "service_tier",
    "prompt_cache_key",
)


def translate_params(params: Mapping[str, Any], source: str, target: str) -> dict[str, Any]:
    """``params`` of a ``source`` API request as a ``target`` API request takes them."""
    if source == target:
        return dict(params)
    chat = params if source == "chat" else _to_chat(params, source)
    if target == "chat":
        return {k: v for k, v in chat.items() if k in _CHAT_KNOWN or _dropped(k, source, target)}
    return _from_chat(chat, target, source)


def _dropped(field: str, source: str, target: str) -> bool:
    if (source, target, field) not in _warned:
        _warned.add((source, target, field))
        _log.info("the %s field %r has no %s counterpart; not sent upstream", source, field, target)
    return False


def _to_chat(params: Mapping[str, Any], source: str) -> dict[str, Any]:
    chat: dict[str, Any] = {}
    for key, value in params.items():
        if key in ("model", "temperature", "top_p", "parallel_tool_calls", "seed", "top_k"):
            chat[key] = value
        elif source == "responses":
            _responses_to_chat(chat, key, value)
        else:
            _messages_to_chat(chat, key, value)
    return chat


def _responses_to_chat(chat: dict[str, Any], key: str, value: Any) -> None:
    if key == "max_output_tokens":
        chat["max_tokens"] = value
    elif key == "reasoning" and isinstance(value, Mapping) and value.get("effort"):
        chat["reasoning_effort"] = value["effort"]
    elif key == "tool_choice":
        chat["tool_choice"] = _choice_to_chat(value)
    elif key in ("user", "safety_identifier") and isinstance(value, str):
        chat.setdefault("user", value)
    elif key in ("metadata", "service_tier", "prompt_cache_key"):
        chat[key] = value
    elif key not in _RESPONSES_ONLY:
        _dropped(key, "responses", "chat")


_RESPONSES_ONLY = frozenset(
    {"store", "include", "truncation", "text", "client_metadata", "reasoning",
     "previous_response_id", "background", "conversation", "prompt"}
)  # fmt: skip


def _messages_to_chat(chat: dict[str, Any], key: str, value: Any) -> None:
    if key == "max_tokens":
        chat["max_tokens"] = value
    elif key == "stop_sequences":
        chat["stop"] = value
    elif key == "tool_choice" and isinstance(value, Mapping):
        kind = value.get("type")
        if kind == "tool":
            chat["tool_choice"] = {"type": "function", "function": {"name": value.get("name")}}
        else:
            chat["tool_choice"] = {"any": "required", "none": "none"}.get(str(kind), "auto")
        if value.get("disable_parallel_tool_use"):
            chat["parallel_tool_calls"] = False
    elif key == "metadata" and isinstance(value, Mapping):
        user = value.get("user_id")
        if isinstance(user, str) and user:
            chat["user"] = user
    elif key not in ("thinking", "context_management", "output_config", "service_tier"):
        _dropped(key, "messages", "chat")


def _choice_to_chat(value: Any) -> Any:
    if isinstance(value, Mapping) and value.get("type") == "function" and value.get("name"):
        return {"type": "function", "function": {"name": value["name"]}}
    if isinstance(value, str):
        return value
    return "auto"


def _from_chat(chat: Mapping[str, Any], target: str, source: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in chat.items():
        if key in ("model", "temperature", "top_p"):
            out[key] = value
        elif key in ("max_tokens", "max_completion_tokens"):
            out["max_output_tokens" if target == "responses" else "max_tokens"] = value
        elif key == "tool_choice":
            out[key] = _choice_from_chat(value, target)
        elif target == "responses" and key in ("user", "metadata", "parallel_tool_calls"):
            out[key] = value
        elif target == "responses" and key == "reasoning_effort":
            out["reasoning"] = {"effort": value}
        elif target == "messages" and key == "stop":
            out["stop_sequences"] = [value] if isinstance(value, str) else value
        elif target == "messages" and key == "user" and isinstance(value, str):
            out["metadata"] = {"user_id": value}
        elif target == "messages" and key == "top_k":
            out[key] = value
        elif target == "messages" and key == "parallel_tool_calls" and value is False:
            choice = out.setdefault("tool_choice", {"type": "auto"})
            if isinstance(choice, dict):
                choice["disable_parallel_tool_use"] = True
        else:
            _dropped(key, source, target)
    return out


def _choice_from_chat(value: Any, target: str) -> Any:
    name = None
    if isinstance(value, Mapping):
        name = (value.get("function") or {}).get("name")
    if target == "responses":
        return {"type": "function", "name": name} if name else value
    if name:
        return {"type": "tool", "name": name}
    return {"type": {"required": "any", "none": "none"}.get(str(value), "auto")}


def user_of(params: Mapping[str, Any], api: str) -> str | None:
    """The end user a request names (``user``; Anthropic's ``metadata.user_id``), for the
    session name of a client that sends no session header."""
    if api == "messages":
        metadata = params.get("metadata")
        value = metadata.get("user_id") if isinstance(metadata, Mapping) else None
    else:
        value = params.get("user") or params.get("safety_identifier")
    return value if isinstance(value, str) and value else None


def claude_session_of(params: Mapping[str, Any]) -> str | None:
    """The session id Claude Code puts in ``metadata.user_id`` (a JSON string), if any."""
    user = user_of(params, "messages")
    if not user or not user.startswith("{"):
        return None
    try:
        value = json.loads(user).get("session_id")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and value else None
