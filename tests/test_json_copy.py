"""The keeper state a step works on is copied as a JSON round trip would copy it: the same value,
with tuples as lists, keys as strings, subclasses in their JSON form, errors raised alike."""

from __future__ import annotations

import enum
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keeper_middleware.sessions.json_copy import json_copy

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=8),
)
keys = st.one_of(st.text(max_size=6), st.integers(-3, 3), st.booleans(), st.none())
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.tuples(inner, inner),
        st.dictionaries(keys, inner, max_size=5),
    ),
    max_leaves=30,
)


class Colour(enum.IntEnum):
    RED = 1


def _same(a: Any, b: Any) -> bool:
    """Equal, of the same types all the way down (``1 == 1.0 == True`` is not enough)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


@settings(max_examples=100, deadline=None)
@given(values)
def test_a_copy_is_the_round_trip(value: Any) -> None:
    copied = json_copy(value)
    assert _same(copied, json.loads(json.dumps(value)))


def test_the_copy_shares_no_container_with_the_original() -> None:
    state = {"seen": ["a", "b"], "items": {"a": 1}, "nested": [{"x": [1]}]}
    copied = json_copy(state)
    copied["seen"].append("c")
    copied["items"]["b"] = 2
    copied["nested"][0]["x"].append(2)
    assert state == {"seen": ["a", "b"], "items": {"a": 1}, "nested": [{"x": [1]}]}


def test_subclasses_and_special_floats_come_back_as_json_has_them() -> None:
    state = {
        "colour": Colour.RED,
        "keys": {1: "one", None: "none", 2.5: "half"},
        "nan": [math.nan, math.inf],
    }
    copied = json_copy(state)
    assert _same(copied, json.loads(json.dumps(state)))
    assert type(copied["colour"]) is int


def test_what_json_cannot_hold_is_refused_alike() -> None:
    with pytest.raises(TypeError):
        json_copy({"when": object()})
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        json_copy({"loop": loop})
