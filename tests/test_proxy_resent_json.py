"""A session's last request confirms the next one's resent part from its kept JSON first (bytes
compared), and compares the parsed messages only when those differ: what it confirms is exactly
what comparing the parsed messages alone confirms, through appends, replies, edits, values written
another way that Python holds equal (``1`` and ``1.0``), keys in another order and truncations."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from keeper_middleware.integrations.proxy.conversation.resent import Resent
from keeper_middleware.integrations.proxy.sessions.last_requests import LastRequests

values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.floats(-3, 3, allow_nan=False).map(lambda f: round(f, 1))
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)
messages = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant"]), "content": values}
)
change = st.one_of(
    st.tuples(st.just("append"), st.lists(messages, min_size=1, max_size=3)),
    st.tuples(st.just("reply"), messages),
    st.tuples(st.just("edit"), st.integers(0, 99), values),
    st.tuples(st.just("reorder"), st.integers(0, 99)),
    st.tuples(st.just("floats"), st.integers(0, 99)),
    st.tuples(st.just("truncate"), st.integers(1, 3)),
    st.just(("same",)),
)


def _floats(value: Any) -> Any:
    """``value`` with its whole numbers written as floats (equal in Python, not in bytes)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return float(value)
    if isinstance(value, list):
        return [_floats(v) for v in value]
    if isinstance(value, dict):
        return {k: _floats(v) for k, v in value.items()}
    return value


def _changed(raw: list[Any], op: tuple[Any, ...]) -> list[Any]:
    """The next request's messages, parsed afresh (new objects, as a new body parses)."""
    raw = orjson.loads(orjson.dumps(raw))
    kind = op[0]
    if kind == "append":
        return [*raw, *copy.deepcopy(op[1])]
    if kind == "edit" and raw:
        at = op[1] % len(raw)
        raw[at] = {**raw[at], "content": op[2]}
    elif kind == "reorder" and raw:
        at = op[1] % len(raw)
        raw[at] = dict(reversed(raw[at].items()))
    elif kind == "floats" and raw:
        at = op[1] % len(raw)
        raw[at] = _floats(raw[at])
    elif kind == "truncate":
        return raw[: max(1, len(raw) - op[1])]
    return raw


def _compared(kept: Sequence[Any], pairs: int, raw: Sequence[Any]) -> int:
    """What comparing the parsed messages alone confirms."""
    count = len(kept)
    if not pairs or count < pairs or len(raw) < count or list(raw[:count]) != list(kept):
        return 0
    return count


def _kept_json(kept: Resent) -> bytes | None:
    """The JSON a kept request stands for: its messages' and then the replies' appended."""
    if kept.json is None:
        return None
    return kept.json[:-1] + b"".join(b"," + value for value in kept.added) + b"]"


@settings(max_examples=150, deadline=None)
@given(st.lists(messages, min_size=1, max_size=4), st.lists(change, min_size=1, max_size=8))
def test_the_kept_json_confirms_what_the_parsed_comparison_confirms(
    first: list[Any], changes: list[tuple[Any, ...]]
) -> None:
    last = LastRequests()
    raw = orjson.loads(orjson.dumps(first))
    kept = last.keep("s", Resent(raw, tuple((None, str(i)) for i in range(len(raw)))))
    for op in changes:
        if op[0] == "reply":
            reply = copy.deepcopy(op[1])
            pair = (None, "reply")
            last.answered("s", kept, reply, pair)
            kept = last.get("s") or kept
            assert _kept_json(kept) in (None, orjson.dumps(kept.raw))
            continue
        raw = _changed(list(kept.raw), op)
        confirmed = kept.confirmed(raw)
        assert confirmed == _compared(kept.raw, len(kept.pairs), raw), op
        kept = last.keep("s", Resent(raw, tuple((None, str(i)) for i in range(len(raw)))))
        assert _kept_json(kept) in (None, orjson.dumps(raw))


def test_from_the_third_request_on_the_kept_json_confirms_without_comparing() -> None:
    class Unequal(dict[str, Any]):
        """A kept message that says it equals nothing: only the bytes can confirm it."""

        def __eq__(self, other: object) -> bool:
            return False

        __hash__ = None  # type: ignore[assignment]

    last = LastRequests()
    raw: list[Any] = [{"role": "user", "content": "a"}]
    kept = last.keep("s", Resent(raw, ((None, "a"),)))
    assert kept.json is None  # the first request: nothing serialized it yet
    raw = [*orjson.loads(orjson.dumps(raw)), {"role": "assistant", "content": "b"}]
    assert kept.confirmed(raw) == 1
    kept = last.keep("s", Resent(raw, ((None, "a"), (None, "b"))))
    assert kept.json == orjson.dumps(raw)
    kept = last.keep("s", Resent([Unequal(m) for m in raw], kept.pairs, kept.json))
    again = [*orjson.loads(orjson.dumps(raw)), {"role": "user", "content": "c"}]
    assert kept.confirmed(again) == 2
    # the reply the agent got, sent back as it came: confirmed from its JSON too
    last.answered("s", kept, Unequal({"role": "assistant", "content": "d"}), (None, "d"))
    kept = last.get("s") or kept
    assert kept.added == (b'{"role":"assistant","content":"d"}',)
    assert kept.confirmed([*orjson.loads(orjson.dumps(kept.raw)), {"role": "user"}]) == 3
    assert (
        kept.confirmed([{"role": "user", "content": "a"}, {"role": "assistant", "content": "x"}])
        == 0
    )
