"""The upstream's chat completion, read for the keeper and passed on to the agent (pure).

The keeper reads a completion as an AIMessage with its usage, finish reason and reasoning where
it looks for them; the agent receives the upstream's own message and envelope, minus the calls of
the proxy's hidden archive search, which only the keeper answers.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from langchain_core.messages import AIMessage

from keeper_middleware.errors import MalformedDataError
from keeper_middleware.integrations.proxy.conversation.form import (
    WIRE_KEY,
    digest_of,
    message_from_openai,
)

__all__ = ["agent_reply", "ai_from_completion", "completion_body", "logprobs_after"]


def ai_from_completion(data: Mapping[str, Any]) -> AIMessage:
    """An upstream completion as an AIMessage: usage, finish reason and reasoning where the keeper
    looks for them (``usage_metadata``, ``response_metadata``, ``additional_kwargs``)."""
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise MalformedDataError("the upstream's reply has no choices")
    raw = choices[0].get("message")
    if not isinstance(raw, dict):
        raise MalformedDataError("the upstream's reply has no message")
    message = message_from_openai({**raw, "role": "assistant"})
    assert isinstance(message, AIMessage)
    reasoning = {
        k: raw[k] for k in ("reasoning_content", "reasoning") if isinstance(raw.get(k), str)
    }
    wire = raw.get(WIRE_KEY)
    if wire is not None:  # the upstream's own items (Responses, Messages) ride along
        reasoning[WIRE_KEY] = {**wire, "check": digest_of(message)}
    metadata = {"finish_reason": choices[0].get("finish_reason"), "model_name": data.get("model")}
    update: dict[str, Any] = {"additional_kwargs": reasoning, "response_metadata": metadata}
    usage = data.get("usage")
    if isinstance(usage, dict):
        details = usage.get("prompt_tokens_details") or {}
        prompt = int(usage.get("prompt_tokens") or 0)
        completion = int(usage.get("completion_tokens") or 0)
        update["usage_metadata"] = {
            "input_tokens": prompt,
            "output_tokens": completion,
            "total_tokens": int(usage.get("total_tokens") or prompt + completion),
            "input_token_details": {"cache_read": int(details.get("cached_tokens") or 0)},
        }
    return message.model_copy(update=update)


def agent_reply(data: Mapping[str, Any], hidden_tool: str | None) -> tuple[dict[str, Any], str]:
    """The message and finish reason the agent receives: upstream's own, minus ``hidden_tool``
    calls (the proxy's archive search, which the agent never sees)."""
    choice = data["choices"][0]
    message = {k: v for k, v in choice["message"].items() if k != WIRE_KEY}
    message["role"] = "assistant"
    calls = [
        c
        for c in message.get("tool_calls") or []
        if not (isinstance(c, dict) and (c.get("function") or {}).get("name") == hidden_tool)
    ]
    if calls:
        message["tool_calls"] = calls
    else:
        message.pop("tool_calls", None)
        if message.get("content") is None:
            message["content"] = ""
    reason = choice.get("finish_reason") or "stop"
    if calls:
        reason = "tool_calls"
    elif reason == "tool_calls":
        reason = "stop"
    return message, reason


def completion_body(
    data: Mapping[str, Any], message: Mapping[str, Any], finish_reason: str
) -> dict[str, Any]:
    """The non-streaming answer: upstream's envelope (id, model, usage) around the agent's reply."""
    body = {k: v for k, v in data.items() if k != "choices"}
    body.setdefault("object", "chat.completion")
    body.setdefault("created", int(time.time()))
    body["choices"] = [
        {
            "index": 0,
            "message": dict(message),
            "finish_reason": finish_reason,
            "logprobs": _choice(data).get("logprobs"),
        }
    ]
    return body


def _choice(data: Mapping[str, Any]) -> Mapping[str, Any]:
    choices = data.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return {}


def logprobs_after(data: Mapping[str, Any], sent: Mapping[str, int]) -> dict[str, Any] | None:
    """The completion's log probabilities past the first ``sent[list]`` of each list (those a
    stream already passed on); None when none are left."""
    logprobs = _choice(data).get("logprobs")
    if not isinstance(logprobs, dict):
        return None
    left = {
        name: entries[sent.get(name, 0) :]
        for name, entries in logprobs.items()
        if isinstance(entries, list)
    }
    return {name: entries for name, entries in left.items() if entries} or None
