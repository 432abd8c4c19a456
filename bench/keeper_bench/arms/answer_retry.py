"""The peers' answer retry: the keeper's, as a LangChain agent middleware.

Every arm asks an empty or cut-off work reply again by one rule and one policy
(``keeper_middleware.graphs.answer_retry``). The peers built on ``create_agent`` (LangChain's
summarisation, Deep Agents) get it as the innermost middleware of their model call, where a user
of those harnesses would add it, so their own context management runs as it ships.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.messages import AIMessage

from keeper_middleware.config import ThinkingPolicy
from keeper_middleware.graphs.answer_retry import ANSWER_RETRY
from keeper_middleware.model.thinking import retry_of


def _again(
    policy: ThinkingPolicy, request: ModelRequest[Any], response: ModelResponse[Any]
) -> ModelRequest[Any] | None:
    """The request to send once more, when the policy says the reply cannot stand."""
    reply = next((m for m in response.result if isinstance(m, AIMessage)), None)
    if reply is None:
        return None
    decided = retry_of(policy, request.model_settings, reply)
    return None if decided is None else request.override(model_settings=decided[1])


class AnswerRetryMiddleware(AgentMiddleware[Any, Any]):
    """Ask a work reply once more when it is empty or thought to its limit (the keeper's rule).

    Args:
        policy: The retry policy (the keeper's default, as every arm gets).
    """

    def __init__(self, policy: ThinkingPolicy = ANSWER_RETRY) -> None:
        super().__init__()
        self.policy = policy

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any]:
        response = handler(request)
        again = _again(self.policy, request, response)
        return response if again is None else handler(again)

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        response = await handler(request)
        again = _again(self.policy, request, response)
        return response if again is None else await handler(again)
