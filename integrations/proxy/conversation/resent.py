"""What a session's last chat request carried, so that the next one's resent part is confirmed by
one comparison (pure).

An agent resends its whole history on every call. The proxy keeps, per session, the last
request's messages as parsed JSON and the (key, fingerprint) it worked out for each; the next
request's messages are compared with them in one list comparison (at C speed, no Python per
message), and when they start with exactly those messages, only what follows is checked, keyed
and fingerprinted. Anything else (an edit, a regenerate, a truncation, another prefix) confirms
nothing, and the request is read whole as before. The fingerprints are a function of a message's
content alone, so reusing them never depends on what the session did in between.

JSON values Python holds equal are taken as the same (``1`` and ``1.0`` in a content part's extra
field): the client resent the message with a number written another way, nothing it says.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Fingerprints", "Resent"]

Fingerprints = tuple[tuple[int | None, str], ...]
"""(key, fingerprint) of each agent message of a request, the system messages left out."""


@dataclass(frozen=True, slots=True)
class Resent:
    """A session's last chat request: its raw messages and its agent messages' fingerprints."""

    raw: Sequence[Any] = ()
    """The request's ``messages`` as parsed JSON, the leading system messages included (empty
    for a request that did not come as Chat Completions JSON: it then confirms nothing)."""
    pairs: Fingerprints = ()
    """(key, fingerprint) of each message after the leading system messages."""

    def answered(self, message: dict[str, Any], pair: tuple[int | None, str]) -> Resent:
        """This request followed by the reply its agent got (``message``, with its key and
        fingerprint): an agent that sends the reply back exactly as it came has it confirmed
        with the rest. Nothing to confirm stays nothing."""
        if not self.raw:
            return self
        return Resent([*self.raw, message], (*self.pairs, pair))  # a list, as ``raw`` comes

    def confirmed(self, raw: Sequence[Any]) -> int:
        """How many messages at the start of ``raw`` are this request's: all of them (when
        ``raw`` starts with exactly these messages and they hold an agent message), else 0."""
        count = len(self.raw)
        if not self.pairs or count < len(self.pairs) or len(raw) < count:
            return 0
        if raw[:count] != self.raw:  # one comparison of the parsed JSON, at C speed
            return 0
        return count
