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

Comparing thousands of parsed messages with the kept ones is still a walk through both (the kept
ones long out of the processor's cache: 0.25–0.6 µs a message, measured). So the kept request
also keeps its messages' JSON (``orjson.dumps``, handed over from the check that serialized
them, and extended by the reply its agent got), and the next request is first checked by
serializing its messages (hot from parsing, about 0.17 µs a message) and comparing bytes: when
its JSON starts with the kept messages' JSON up to a message boundary, it starts with exactly
those messages (the same bytes parse to the same values: JSON values are self-delimiting). Only
when the bytes differ (an edit, or a value written another way that Python holds equal) are the
parsed messages compared as before, so what is confirmed is exactly what the comparison alone
confirms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

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
    json: bytes | None = field(default=None, compare=False, repr=False)
    """``orjson.dumps`` of ``raw`` without the messages in ``added``, when known (None: the
    messages are compared as parsed)."""
    added: tuple[bytes, ...] = field(default=(), compare=False, repr=False)
    """``orjson.dumps`` of each message :meth:`answered` appended to ``raw`` since ``json``
    (kept apart: the JSON of thousands of messages is not copied to add one)."""
    next_json: list[tuple[Sequence[Any], bytes]] = field(
        default_factory=list, compare=False, repr=False
    )
    """The raw messages :meth:`confirmed` last serialized, with their JSON: the next request's,
    for the :class:`Resent` made of it (:meth:`followed_by`)."""

    def answered(self, message: dict[str, Any], pair: tuple[int | None, str]) -> Resent:
        """This request followed by the reply its agent got (``message``, with its key and
        fingerprint): an agent that sends the reply back exactly as it came has it confirmed
        with the rest. Nothing to confirm stays nothing."""
        if not self.raw:
            return self
        added = _json(message) if self.json is not None else None
        return Resent(
            [*self.raw, message],  # a list, as ``raw`` comes
            (*self.pairs, pair),
            self.json if added is not None else None,
            (*self.added, added) if added is not None else (),
        )

    def followed_by(self, resent: Resent) -> Resent:
        """``resent`` (the next request of the session), with its messages' JSON when this
        request's check serialized those very messages (:meth:`confirmed`)."""
        seen = self.next_json
        if resent.json is not None or not seen or seen[0][0] is not resent.raw:
            return resent
        return Resent(resent.raw, resent.pairs, seen.pop()[1])

    def confirmed(self, raw: Sequence[Any]) -> int:
        """How many messages at the start of ``raw`` are this request's: all of them (when
        ``raw`` starts with exactly these messages and they hold an agent message), else 0."""
        count = len(self.raw)
        if not self.pairs or count < len(self.pairs) or len(raw) < count:
            return 0
        whole = _json(raw)  # serialized once: checked here, kept by the next request's own
        if whole is not None:
            self.next_json[:] = [(raw, whole)]
            if self.json is not None and _starts_with(whole, self.json, self.added):
                return count
        if raw[:count] != self.raw:  # one comparison of the parsed JSON, at C speed
            return 0
        return count


def _json(value: Any) -> bytes | None:
    """``orjson.dumps(value)``; None for what JSON cannot hold (then compared as parsed)."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return None


def _starts_with(whole: bytes, json: bytes, added: Sequence[bytes]) -> bool:
    """Whether the JSON list ``whole`` starts with the elements of the JSON list ``json``
    followed by the JSON values ``added`` (each ``orjson.dumps``): its bytes up to ``json``'s
    closing bracket, each of ``added`` after a comma, then a comma or its own closing bracket
    (each element is self-delimiting, so that is a boundary in both). Nothing is copied."""
    end = len(json) - 1
    if end < 2 or not whole.startswith(memoryview(json)[:end]):  # "[]" holds no element
        return False
    for value in added:
        if whole[end : end + 1] != b"," or not whole.startswith(value, end + 1):
            return False
        end += 1 + len(value)
    return whole[end : end + 1] in (b",", b"]")
