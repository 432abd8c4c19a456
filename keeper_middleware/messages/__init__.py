"""Facts about messages: what kind each is, the keeper's own marks, and content blocks as text."""

from keeper_middleware.messages.facts import is_keeper_message

__all__ = ["is_keeper_message"]
