"""Recognising the keeper's own messages in a way no model reply or user input can forge.

The keeper's messages (NOTES, the RULES beside a question, retrieved passages) carry their kind in
``additional_kwargs["keeper"]``. Anything can carry that key: a model reply tagged "rules" was
once never archived (silent loss), one tagged "notes" wedged its thread. So each keeper message
also carries a mark: an HMAC of its kind and id under a secret the keeper keeps per session in
its archive (never sent to a model). Where messages enter a step, a tag without a valid mark is
removed (:func:`verified`) and the message is ordinary content from then on: noted, archived and
searchable like any other turn.

The mark covers the kind and the id, not the text, so the keeper may re-render its own message
in place (the proxy lowers the NOTES' kept count after an edit) without signing it again.
"""

from __future__ import annotations

import hashlib
import hmac
import operator
import secrets
from collections.abc import Callable, Sequence
from itertools import compress, count, repeat

from langchain_core.messages import BaseMessage, HumanMessage

from keeper_middleware.errors import ConfigurationError
from keeper_middleware.messages.facts import KEEPER_KEY

_EXTRA = operator.attrgetter("additional_kwargs")
MARK_KEY = "keeper_mark"
SECRET_KEY = "keeper_secret"
"""Where the per-session secret is kept among the archive's per-session values."""


def new_secret() -> str:
    return secrets.token_hex(32)


def mark_of(secret: str, kind: str, msg_id: str) -> str:
    message = f"{kind}\0{msg_id}".encode("utf-8", "surrogatepass")
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()[:32]


def signed(message: BaseMessage, secret: str) -> BaseMessage:
    """``message`` (a keeper message with an id) with its mark."""
    kind = message.additional_kwargs.get(KEEPER_KEY)
    if not isinstance(kind, str) or not message.id:
        raise ConfigurationError("only a keeper message with an id can be signed")
    kwargs = {**message.additional_kwargs, MARK_KEY: mark_of(secret, kind, message.id)}
    return message.model_copy(update={"additional_kwargs": kwargs})


def is_genuine(message: BaseMessage, secret: str) -> bool:
    """A user-role message whose keeper tag carries a valid mark."""
    kind = message.additional_kwargs.get(KEEPER_KEY)
    mark = message.additional_kwargs.get(MARK_KEY)
    if not isinstance(message, HumanMessage) or not isinstance(kind, str) or not message.id:
        return False
    return isinstance(mark, str) and hmac.compare_digest(mark, mark_of(secret, kind, message.id))


def verified(
    messages: Sequence[BaseMessage], secret: Callable[[], str]
) -> tuple[list[BaseMessage], int]:
    """The messages with every forged keeper tag removed, and how many were removed.

    ``secret`` is asked for only when a message carries a tag (so a request refused before the
    keeper wrote anything stores nothing, not even a secret)."""
    result = list(messages)
    forged = 0
    for index in _tagged(result):
        message = result[index]
        if not is_genuine(message, secret()):
            kwargs = {
                k: v
                for k, v in message.additional_kwargs.items()
                if k not in (KEEPER_KEY, MARK_KEY)
            }
            result[index] = message.model_copy(update={"additional_kwargs": kwargs})
            forged += 1
    return result, forged


def _tagged(messages: Sequence[BaseMessage]) -> list[int]:
    """The indices of the messages carrying a keeper tag or mark, in order (found at C speed: a
    window of thousands of messages holds a handful of the keeper's own)."""
    extras = list(map(_EXTRA, messages))
    tagged = {
        *compress(count(), map(operator.contains, extras, repeat(KEEPER_KEY))),
        *compress(count(), map(operator.contains, extras, repeat(MARK_KEY))),
    }
    return sorted(tagged)
