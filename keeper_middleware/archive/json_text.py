"""Per-session values handed to a store already written as JSON text.

A store of per-session values writes each value as ``json.dumps(value, ensure_ascii=False,
allow_nan=False)``. A proxy saves the newest window messages at every request, and a message is
written several times while it stays in view (in the small pieces a save joins, then in a full
chunk): encoding each message once, while it stays in view, and joining the texts gives the very
same text for a fraction of the work. :class:`JSONText` carries such a text to a store that says
it takes it (``takes_json_text``), which writes it as it is; any other store is handed the value
read back (:func:`plain`), so it never sees the difference.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["JSONText", "dict_text", "list_text", "plain", "takes_json_text", "value_text"]

_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False)
"""``json.dumps(value, ensure_ascii=False, allow_nan=False)`` without making an encoder for
each value (a save writes several)."""


_KEY = json.encoder.encode_basestring  # type: ignore[attr-defined]


class JSONText(str):
    """A value already written as JSON text, exactly as :func:`value_text` writes it."""

    __slots__ = ()


def value_text(value: Any) -> str:
    """The JSON text a store writes for ``value`` (a :class:`JSONText` is that text already).

    Raises:
        TypeError: something in ``value`` is not JSON-able.
        ValueError: a float in ``value`` is NaN or infinite.
    """
    if type(value) is JSONText:
        return value
    return _ENCODER.encode(value)


def list_text(texts: Iterable[str]) -> JSONText:
    """The text of a list whose entries' texts are ``texts`` (``json.dumps``'s separators)."""
    return JSONText(f"[{', '.join(texts)}]")


def dict_text(texts: Mapping[str, str]) -> JSONText:
    """The text of a mapping whose values' texts are ``texts``, keys in their order."""
    # ``encode_basestring`` is what the encoder writes a string key with (``ensure_ascii=False``)
    return JSONText("{" + ", ".join([f"{_KEY(key)}: {text}" for key, text in texts.items()]) + "}")


def takes_json_text(store: object) -> bool:
    """Whether ``store`` writes a :class:`JSONText` value as it is (its ``takes_json_text``)."""
    return getattr(type(store), "takes_json_text", False) is True


def plain(values: Mapping[str, Any]) -> Mapping[str, Any]:
    """``values`` with each :class:`JSONText` read back, for a store that does not take them."""
    if not any(type(v) is JSONText for v in values.values()):
        return values
    return {k: json.loads(v) if type(v) is JSONText else v for k, v in values.items()}
