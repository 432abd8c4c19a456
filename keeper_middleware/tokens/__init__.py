"""Counting tokens: the keeper's ``TokenCounter`` protocol, its approximate default, and
LangChain's counters behind it.
"""

from keeper_middleware.tokens.counting import ApproximateTokenCounter, TokenCounter

__all__ = ["ApproximateTokenCounter", "TokenCounter"]
