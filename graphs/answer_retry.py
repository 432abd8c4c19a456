"""The answer retry every arm gets, whatever manages its context.

The keeper asks a work reply again when it is empty or thought to its limit and wrote nothing
(``Keeper.retry_kwargs``). An arm without that retry would lose a whole question set to one empty
reply that the keeper's harness asks again, and a comparison would count that as a memory
failure. So every arm's model call (the baselines', rag's, the self-editing arms', the peers')
asks again by the same pure rule (``keeper_middleware.model.thinking.retry_of``) with the same
policy: the keeper's default.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import BaseMessage
from langchain_core.runnables import Runnable, RunnableConfig

from keeper_middleware.config import ThinkingPolicy
from keeper_middleware.model.thinking import retry_of

ANSWER_RETRY = ThinkingPolicy()
"""The answer retry every arm's work call gets: the keeper's default policy (a reply that thought
to its limit asked again with thinking off, an empty one once more with some randomness), so an
arm never loses a whole reply to a fault another arm's harness would have asked again."""


def retry_kwargs_of(policy: ThinkingPolicy | None, reply: BaseMessage) -> dict[str, Any] | None:
    """The call kwargs to ask a work reply again with (None: it stands), by ``policy``."""
    if policy is None:
        return None
    decided = retry_of(policy, {}, reply)
    return None if decided is None else decided[1]


def answer_with_retry(
    bound: Runnable[Any, BaseMessage],
    messages: Sequence[BaseMessage],
    config: RunnableConfig | None,
    policy: ThinkingPolicy | None = ANSWER_RETRY,
) -> BaseMessage:
    """One work call, asked once more when ``policy`` says the reply cannot stand."""
    reply = bound.invoke(list(messages), config)
    again = retry_kwargs_of(policy, reply)
    return reply if again is None else bound.invoke(list(messages), config, **again)


async def aanswer_with_retry(
    bound: Runnable[Any, BaseMessage],
    messages: Sequence[BaseMessage],
    config: RunnableConfig | None,
    policy: ThinkingPolicy | None = ANSWER_RETRY,
) -> BaseMessage:
    """``answer_with_retry``, async."""
    reply = await bound.ainvoke(list(messages), config)
    again = retry_kwargs_of(policy, reply)
    return reply if again is None else await bound.ainvoke(list(messages), config, **again)
