"""When the model thinks, and when a reply is asked again (pure).

Thinking stays on for note calls and while a question is open; a reply that thought to its
limit and wrote nothing is asked again without thinking, and an empty reply once more with
some randomness. A policy with no switch for thinking off would send the very request that
thought to its limit again (a server that samples greedily thinks to its limit again: a whole
question set was lost that way), so that retry gets the randomness too. Every caller (note calls, the node, the middleware, the proxy) decides here,
so they switch thinking and retry alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langchain_core.messages import BaseMessage

from keeper_middleware.config import ThinkingPolicy
from keeper_middleware.messages.facts import is_empty_reply, thought_to_limit


def call_kwargs(policy: ThinkingPolicy, *, thinking: bool) -> dict[str, Any]:
    """Call kwargs with thinking on or off, as the policy says to switch it."""
    kwargs: dict[str, Any] = {}
    if policy.reasoning_effort is not None:
        kwargs["reasoning_effort"] = policy.reasoning_effort
    kwargs.update(policy.on if thinking else policy.off)
    return kwargs


def differing(
    again: Mapping[str, Any], first: Mapping[str, Any], policy: ThinkingPolicy
) -> dict[str, Any]:
    """``again``, with the policy's randomness when it would send the same call as ``first``
    (no switch turns thinking off): a retry that cannot come out different is no retry."""
    if dict(again) != dict(first):
        return dict(again)
    return {**again, **policy.sample_after_stop}


def retry_of(
    policy: ThinkingPolicy, kwargs: Mapping[str, Any], reply: BaseMessage
) -> tuple[str, dict[str, Any]] | None:
    """How a work reply is asked again: the counter that counts the retry and the call kwargs
    to ask with; None when the reply stands."""
    if thought_to_limit(reply):
        if not policy.retry_empty_without_thinking:
            return None
        cleaned = {k: v for k, v in kwargs.items() if k not in policy.on}
        return "thinking_retries", differing({**cleaned, **policy.off}, kwargs, policy)
    if is_empty_reply(reply) and policy.retry_empty:
        return "empty_retries", {**kwargs, **policy.sample_after_stop}
    return None
