"""Per-session values handed to a store already written as JSON text.

A store of per-session values writes each value as its compact JSON text (:func:`value_text`:
what ``json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))`` means,
written by orjson, an order of magnitude faster, wherever orjson's text reads back as the very
value). A proxy saves the newest window messages at every request, and a message is written
several times while it stays in view (in the small pieces a save joins, then in a full chunk):
encoding each message once, while it stays in view, and joining the texts gives the same text
for a fraction of the work. :class:`JSONText` carries such a text to a store that says it takes
it (``takes_json_text``), which writes it as it is; any other store is handed the value read
back (:func:`plain`), so it never sees the difference.

Stored values are only ever read back by parsing them, so a value written by an earlier release
(``json.dumps``'s ``", "`` and ``": "`` separators) reads exactly as one written now.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

__all__ = ["JSONText", "dict_text", "list_text", "plain", "takes_json_text", "value_text"]

_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
"""The encoder of the values orjson does not write as they are (made once: a save writes
several values)."""

_KEY = json.encoder.encode_basestring  # type: ignore[attr-defined]


class JSONText(str):
    """A value already written as JSON text, exactly as :func:`value_text` writes it."""

    __slots__ = ()


def value_text(value: Any) -> str:
    """The JSON text a store writes for ``value`` (a :class:`JSONText` is that text already).

    orjson writes it when its text reads back equal to ``value``; anything else is written by
    the stdlib encoder, so what it refuses is refused as before: orjson writes a NaN or an
    infinite float as ``null``, a datetime or a dataclass as text or a mapping, a tuple as a
    list, and those read back as something else; it refuses odd keys, integers past 64 bits
    and lone surrogates outright.

    Raises:
        TypeError: something in ``value`` is not JSON-able.
        ValueError: a float in ``value`` is NaN or infinite.
    """
    if type(value) is JSONText:
        return value
    try:
        text = orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return _ENCODER.encode(value)
    if orjson.loads(text) != value:
        return _ENCODER.encode(value)
    return text.decode()


def list_text(texts: Iterable[str]) -> JSONText:
    """The text of a list whose entries' texts are ``texts`` (:func:`value_text`'s separators)."""
    return JSONText(f"[{','.join(texts)}]")


def dict_text(texts: Mapping[str, str]) -> JSONText:
    """The text of a mapping whose values' texts are ``texts``, keys in their order."""
    # ``encode_basestring`` is what the encoder writes a string key with (``ensure_ascii=False``)
    return JSONText("{" + ",".join([f"{_KEY(key)}:{text}" for key, text in texts.items()]) + "}")


def takes_json_text(store: object) -> bool:
    """Whether ``store`` writes a :class:`JSONText` value as it is (its ``takes_json_text``)."""
    return getattr(type(store), "takes_json_text", False) is True


def plain(values: Mapping[str, Any]) -> Mapping[str, Any]:
    """``values`` with each :class:`JSONText` read back, for a store that does not take them."""
    if not any(type(v) is JSONText for v in values.values()):
        return values
    return {k: json.loads(v) if type(v) is JSONText else v for k, v in values.items()}
