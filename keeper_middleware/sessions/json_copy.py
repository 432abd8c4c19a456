"""A copy of JSON-like data exactly as a JSON round trip gives it, without the round trip.

Every step works on its own copy of the keeper state it was given (the graph's channel, the
proxy's record), and the state holds an entry per message in view (the ``seen`` ids, the item
numbers): written out as JSON text and read back, a window of thousands of messages cost a step
more than deciding it. The copy here gives the same result (tuples as lists, keys as strings,
subclasses as their JSON form) by copying plain containers directly and handing anything else to
the round trip, so the two cannot differ.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["json_copy"]

_SCALARS = frozenset({str, int, float, bool, type(None)})
"""Types a round trip gives back as an equal, immutable value of the same type."""


def json_copy(value: Any) -> Any:
    """``json.loads(json.dumps(value))``, the same value, made faster for plain containers.

    Raises:
        TypeError: a value JSON cannot hold, as ``json.dumps`` raises it.
        ValueError: a circular reference, as ``json.dumps`` raises it.
    """
    try:
        return _copy(value)
    except RecursionError:  # a circular (or very deep) structure: as the round trip has it
        return json.loads(json.dumps(value))


def _copy(value: Any) -> Any:
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is list or kind is tuple:
        if set(map(type, value)) <= _SCALARS:
            return list(value)
        return [_copy(item) for item in value]
    if kind is dict and set(map(type, value)) <= {str}:
        if set(map(type, value.values())) <= _SCALARS:
            return dict(value)
        return {key: _copy(item) for key, item in value.items()}
    return json.loads(json.dumps(value))
