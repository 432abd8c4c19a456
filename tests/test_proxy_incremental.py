"""A continuing session's resent history is read incrementally (only what follows the last
request is checked, fingerprinted and taken in); whatever the agent does to its history, that
gives exactly what reading and matching every request whole gives: the same session record and
the same upstream requests, byte for byte. Two proxies are driven side by side through random
sequences of appends, tool rounds, edits, regenerates, truncations, trims, resends and requests
of another prefix, one of them with the incremental path turned off."""

from __future__ import annotations

import asyncio
import difflib
import json
import random
import re
import tempfile
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keeper_middleware.integrations.proxy.conversation.chat_request import parse_chat_request
from keeper_middleware.integrations.proxy.conversation.resent import Resent
from keeper_middleware.integrations.proxy.sessions.history import take_in
from keeper_middleware.integrations.proxy.sessions.records import SessionRecord
from tests.proxy_upstream import (
    AGENT_TOOL,
    SYSTEM,
    ScriptedUpstream,
    client_for,
    make_app,
    text_reply,
    tool_reply,
)

PAD = " ".join(f"ledger line {i} holds figure {i * 7}." for i in range(10))
_ID = re.compile(r"p-[0-9a-f]{16}|\b[0-9a-f]{32}\b")

operation = st.one_of(
    st.just(("append",)),
    st.just(("tool",)),
    st.tuples(st.just("edit"), st.integers(0, 60)),
    st.just(("regenerate",)),
    st.tuples(st.just("truncate"), st.integers(1, 5)),
    st.tuples(st.just("trim"), st.integers(1, 5)),
    st.just(("resend",)),
    st.just(("other_prefix",)),
)


@dataclass
class RecordingUpstream(ScriptedUpstream):
    """The scripted upstream, keeping the bytes of every request as the proxy sent them."""

    sent: list[bytes] = field(default_factory=list)

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request.content)
        return super().handle(request)


def _side(folder: Path, *, incremental: bool) -> tuple[Any, RecordingUpstream]:
    """A proxy (incremental or reading every request whole) and its recording upstream; the
    upstream asks for a tool call when the last message starts with T, else answers text."""
    replies = count()

    def reply(body: dict[str, Any]) -> Any:
        number = next(replies)
        last = body["messages"][-1].get("content") or ""
        if isinstance(last, str) and last.startswith("T"):
            return tool_reply((f"call_{number}", "read_file", {"path": f"f{number}"}))
        return text_reply(f"R{number}: noted.")

    upstream = RecordingUpstream(default=reply)
    app = make_app(upstream, folder, window=3072)
    app.state.proxy.incremental = incremental
    return app, upstream


def _canonical(record: SessionRecord) -> str:
    """The record as JSON with the proxy's random message ids numbered in order of appearance
    (window, fingerprints, then the keeper's state, where a set of ids is listed sorted)."""
    data = record.to_json()
    names: dict[str, str] = {}

    def named(found: re.Match[str]) -> str:
        return names.setdefault(found.group(0), f"id{len(names)}")

    ordered = {k: v for k, v in data.items() if k != "keeper_state"}
    text = _ID.sub(named, json.dumps(ordered, sort_keys=True))
    state = json.loads(_ID.sub(named, json.dumps(data["keeper_state"], sort_keys=True)))
    return text + json.dumps(_id_sets_sorted(state), sort_keys=True)


def _id_sets_sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _id_sets_sorted(v) for k, v in value.items()}
    if isinstance(value, list):
        if value and all(isinstance(v, str) and "id" in v for v in value):
            return sorted(value)
        return [_id_sets_sorted(v) for v in value]
    return value


async def _run(
    ops: list[tuple[Any, ...]], folder: Path, *, incremental: bool
) -> tuple[list[Any], list[str], list[bytes]]:
    """Every answer, the session's record after each request, and the upstream's requests.
    The proxy's message ids come from ``random``, seeded the same for both runs, so the two
    runs give their messages the same ids (the archive's read handles are made from them)."""
    random.seed(20_260_401)
    numbers = count()
    app, upstream = _side(folder, incremental=incremental)
    proxy = app.state.proxy
    history: list[dict[str, Any]] = []
    answers: list[Any] = []
    records: list[str] = []

    def user(prefix: str = "M") -> dict[str, Any]:
        return {"role": "user", "content": f"{prefix}{next(numbers)}: {PAD}"}

    async with client_for(app) as client:
        for op in [("append",), *ops]:
            kind = op[0]
            if kind == "append" or not history:
                history.append(user())
            elif kind == "tool":
                history.append(user("T"))
            elif kind == "edit":
                at = op[1] % len(history)
                history[at] = {**history[at], "content": f"E{next(numbers)}: edited {PAD}"}
            elif kind == "regenerate" and history[-1]["role"] == "assistant":
                history.pop()
            elif kind == "truncate":
                history = history[: max(1, len(history) - op[1])]
            elif kind == "trim":
                history = history[min(op[1], len(history) - 1) :]
            elif kind == "other_prefix":
                history = [user("P"), *history[1:]]
            if history[-1]["role"] == "assistant" and history[-1].get("tool_calls"):
                call = history[-1]["tool_calls"][0]
                history.append({"role": "tool", "tool_call_id": call["id"], "content": PAD})
            body = {
                "model": "m",
                "messages": [{"role": "system", "content": SYSTEM}, *history],
                "tools": [AGENT_TOOL],
            }
            got = await client.post(
                "/v1/chat/completions", json=body, headers={"X-Keeper-Session": "owner"}
            )
            answers.append((got.status_code, got.json()))
            assert got.status_code == 200, got.text
            history.append(got.json()["choices"][0]["message"])
            records.append(_canonical(proxy.record("default:owner")))
    await proxy.aclose()
    return answers, records, upstream.sent


async def _replay(ops: list[tuple[Any, ...]], folder: Path) -> None:
    fast = await _run(ops, folder / "incremental", incremental=True)
    whole = await _run(ops, folder / "whole", incremental=False)
    assert fast[0] == whole[0]
    for step, (one, other) in enumerate(zip(fast[1], whole[1], strict=True)):
        assert one == other, f"after request {step}:\n" + "\n".join(
            difflib.unified_diff(one.split(", "), other.split(", "), lineterm="")
        )
    assert fast[2] == whole[2]


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(operation, min_size=1, max_size=14))
def test_incremental_and_whole_matching_keep_the_same_session_and_send_the_same_bytes(ops):
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(_replay(ops, Path(folder)))


def test_a_continuing_request_confirms_its_resent_part_and_reads_only_what_is_new():
    first = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "a"}]}
    parsed = parse_chat_request(first)
    pairs = parsed.digests_reusing(())
    resent = Resent(parsed.raw, pairs)
    grown = [*first["messages"], {"role": "assistant", "content": "b"}]
    again = parse_chat_request({"messages": grown}, resent)
    assert again.resent_pairs == pairs
    assert again.digests_reusing(()) == parse_chat_request({"messages": grown}).digests_reusing(())
    edited = [first["messages"][0], {"role": "user", "content": "A"}, grown[2]]
    assert parse_chat_request({"messages": edited}, resent).resent_pairs == ()


def test_a_bad_new_message_after_a_confirmed_part_is_still_refused():
    first = {"messages": [{"role": "user", "content": "a"}]}
    parsed = parse_chat_request(first)
    resent = Resent(parsed.raw, parsed.digests_reusing(()))
    bad = {"messages": [*first["messages"], {"role": "tool", "content": "no call id"}]}
    try:
        parse_chat_request(bad, resent)
    except ValueError as exc:
        assert "tool_call_id" in str(exc)
    else:
        raise AssertionError("a tool result without its call id was taken")


def test_the_appending_intake_equals_the_aligning_one():
    record = SessionRecord()
    request = parse_chat_request({"messages": [{"role": "user", "content": "x"}]})
    digests = [d for _, d in request.digests_reusing(())]
    ids = iter(f"p-{n:016x}" for n in range(100))
    again = iter(f"p-{n:016x}" for n in range(100))
    fast = take_in(record, request.messages, digests, lambda: next(ids), lambda ids: set())
    whole = take_in(
        record, request.messages, digests, lambda: next(again), lambda ids: set(), incremental=False
    )
    assert fast == whole
