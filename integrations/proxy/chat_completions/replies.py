"""The upstream's chat completion, read for the keeper and passed on to the agent (pure).

The keeper reads a completion as an AIMessage with its usage, finish reason and reasoning where
it looks for them; the agent receives the upstream's own message and envelope, minus the calls of
the proxy's hidden archive search, which only the keeper answers.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage

from keeper_middleware.errors import MalformedDataError
from keeper_middleware.integrations.proxy.conversation.chat_messages import (
    assistant_from_openai,
    message_from_openai,
)
from keeper_middleware.integrations.proxy.conversation.digests import digest_of
from keeper_middleware.integrations.proxy.conversation.form import WIRE_KEY
from keeper_middleware.messages.facts import text_of

__all__ = [
    "Completion",
    "agent_reply",
    "ai_from_completion",
    "as_received",
    "completion_body",
    "logprobs_after",
    "read_completion",
    "received_digest",
]


@dataclass(frozen=True, slots=True)
class Completion:
    """An upstream completion read once: checked when it arrives (a reply that cannot be read is
    retried like a failed call), then used as it was read."""

    data: dict[str, Any]
    """The completion's JSON, as the upstream sent it (read into a chat completion)."""
    reply: AIMessage
    """What :func:`ai_from_completion` gives: the keeper's form of it."""

    @property
    def said(self) -> AIMessage:
        """The completion's message alone, as
        :func:`~..conversation.chat_messages.message_from_openai` reads it: what an agent's copy
        of it reads as when no call of it was hidden. Made when asked (:attr:`reply` without
        what the keeper reads beside the message): a plain reply needs only its fingerprint,
        which is the reply's own (:func:`received_digest`)."""
        return self.reply.model_copy(
            update={"additional_kwargs": {}, "response_metadata": {}, "usage_metadata": None}
        )


def ai_from_completion(data: Mapping[str, Any]) -> AIMessage:
    """An upstream completion as an AIMessage: usage, finish reason and reasoning where the keeper
    looks for them (``usage_metadata``, ``response_metadata``, ``additional_kwargs``)."""
    return read_completion(data if isinstance(data, dict) else dict(data)).reply


def read_completion(data: dict[str, Any]) -> Completion:
    """An upstream completion read once (:class:`Completion`).

    Raises:
        MalformedDataError: the completion holds no message.
        RequestError: its message cannot be read (a malformed tool call).
    """
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise MalformedDataError("the upstream's reply has no choices")
    raw = choices[0].get("message")
    if not isinstance(raw, dict):
        raise MalformedDataError("the upstream's reply has no message")
    reasoning = {
        k: raw[k] for k in ("reasoning_content", "reasoning") if isinstance(raw.get(k), str)
    }
    metadata = {"finish_reason": choices[0].get("finish_reason"), "model_name": data.get("model")}
    fields: dict[str, Any] = {"additional_kwargs": reasoning, "response_metadata": metadata}
    usage = data.get("usage")
    if isinstance(usage, dict):
        details = usage.get("prompt_tokens_details") or {}
        prompt = int(usage.get("prompt_tokens") or 0)
        completion = int(usage.get("completion_tokens") or 0)
        fields["usage_metadata"] = {
            "input_tokens": prompt,
            "output_tokens": completion,
            "total_tokens": int(usage.get("total_tokens") or prompt + completion),
            "input_token_details": {"cache_read": int(details.get("cached_tokens") or 0)},
        }
    reply = assistant_from_openai(raw, **fields)  # made once, with what the keeper reads
    wire = raw.get(WIRE_KEY)
    if wire is not None:  # the upstream's own items (Responses, Messages) ride along
        # the fingerprint reads none of the fields above: the message's own, as before
        reply.additional_kwargs[WIRE_KEY] = {**wire, "check": digest_of(reply)}
    return Completion(data, reply)


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


def received_digest(done: Completion, message: Mapping[str, Any], carried: str = "") -> str:
    """``digest_of`` the agent's ``message`` as :func:`as_received` reads it, after ``carried``
    (text a streaming agent got from earlier calls of the request, before this reply's). When
    nothing was hidden or carried, the reply's own fingerprint: usage, metadata and reasoning
    are no part of one, so the message is not read again or copied."""
    calls = done.data["choices"][0]["message"].get("tool_calls") or []
    if not carried and (message.get("tool_calls") or []) == calls:
        return digest_of(done.reply)
    received = as_received(done, message)
    if carried:
        received = received.model_copy(update={"content": carried + text_of(received)})
    return digest_of(received)


def as_received(done: Completion, message: Mapping[str, Any]) -> BaseMessage:
    """The agent's ``message`` (:func:`agent_reply` of ``done``) read as a LangChain message:
    the completion's own reading when no call of it was hidden from the agent (the same
    message, read once), else read anew."""
    calls = done.data["choices"][0]["message"].get("tool_calls") or []
    if (message.get("tool_calls") or []) == calls:
        return done.said
    return message_from_openai(message)


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
