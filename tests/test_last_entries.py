"""A step that only appends to the window its session's last step ended with classifies only the
new messages, and decides exactly as a step that classifies the whole window.

Two keepers run the same random sequence of appends (inputs, questions, tool rounds, replies),
edits (a message replaced under its id), regenerates (the last reply dropped and answered anew),
truncations, changes made in place to a message object and resends of an earlier window. One
keeps each session's last entries (the fast path); the other forgets them before every step (the
full path). Their windows, keeper states, decisions and counters must be equal at every step;
through keeper-proxy, the session records and the upstream's requests must be the same bytes.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    ToolMessage,
    messages_to_dict,
)

from keeper_middleware import Keeper, KeeperConfig, ModelSetup
from keeper_middleware.messages.facts import keeper_kind
from keeper_middleware.step import entries
from keeper_middleware.step.entries import Entry
from keeper_middleware.step.known import LastEntries
from keeper_middleware.step.result import StepResult
from tests import test_proxy_incremental as incremental

CONFIG = KeeperConfig(window=2048, reply_reserve=256, notes_every_items=4)
"""Cuts every few items or when the window fills, so a sequence makes several cuts."""
ROOMY = KeeperConfig(window=32_768)
"""Nothing is cut: every step appends to the window the last one ended with."""
SETUP = ModelSetup(system_prompt="Keep a tally of the counters.")
WORDS = ("alpha", "bravo", "harbour", "ledger", "parcel", "overdrawn", "clerk")
KINDS = (
    *("input", "input", "question", "tool", "tool", "reply"),
    *("edit", "regenerate", "truncate", "mutate", "resend"),
)


def _note_call(messages: list[BaseMessage], kwargs: Any) -> AIMessage:
    return AIMessage(content="NO CHANGES")


@st.composite
def operations(draw: st.DrawFn) -> list[tuple[str, str, int]]:
    ops = []
    for _ in range(draw(st.integers(3, 18))):
        words = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=30))
        ops.append((draw(st.sampled_from(KINDS)), " ".join(words), draw(st.integers(0, 999))))
    return ops


class Arm:
    """A keeper and the window it handed back, as an adapter keeps it."""

    def __init__(
        self, *, full_path: bool, config: KeeperConfig = CONFIG, unchanged_in_place: bool = False
    ) -> None:
        self.keeper = Keeper(config, unchanged_in_place=unchanged_in_place)
        self.full_path = full_path
        self.history: list[BaseMessage] = [HumanMessage("Tally every counter.", id="task")]
        self.state: dict[str, Any] | None = None
        self.earlier: list[tuple[list[BaseMessage], dict[str, Any] | None]] = []

    def step(self) -> StepResult:
        if self.full_path:
            self.keeper.last_entries.forget("s")
        result = self.keeper.step("s", list(self.history), self.state, SETUP, _note_call)
        self.history, self.state = list(result.messages), result.state
        self.earlier.append((list(self.history), self.state))
        return result

    def apply(self, kind: str, text: str, number: int) -> None:
        history = self.history
        theirs = [i for i, m in enumerate(history) if keeper_kind(m) is None and i > 0]
        if kind == "input":
            history.append(HumanMessage(f"Item {number}: {text}.", id=f"in-{number}"))
        elif kind == "question":
            history.append(HumanMessage(f"{text}. What is alpha now?", id=f"q-{number}"))
        elif kind == "reply":
            history.append(AIMessage(f"Noted: {text}.", id=f"r-{number}"))
        elif kind == "tool":
            call = {"name": "read", "args": {}, "id": f"c-{number}"}
            history.append(AIMessage("", id=f"a-{number}", tool_calls=[call]))
            history.append(ToolMessage(text, tool_call_id=f"c-{number}", id=f"t-{number}"))
        elif kind == "regenerate" and history and isinstance(history[-1], AIMessage):
            history[-1] = AIMessage(f"Again: {text}.", id=f"r-{number}")
        elif kind == "truncate" and theirs:
            del history[theirs[number % len(theirs)] :]
        elif kind == "edit" and theirs:
            at = theirs[number % len(theirs)]
            history[at] = history[at].model_copy(update={"content": f"Edited: {text}."})
        elif kind == "resend" and self.earlier:
            messages, self.state = self.earlier[number % len(self.earlier)]
            self.history = list(messages)


def _mutate(arms: Sequence[Arm], text: str, number: int) -> None:
    """Change one message object in place, in every arm (a caller that should not, but may)."""
    for arm in arms:
        theirs = [m for m in arm.history if keeper_kind(m) is None and isinstance(m.content, str)]
        if theirs:
            theirs[number % len(theirs)].content = f"Changed: {text}."


def _outcome(arm: Arm, result: StepResult) -> dict[str, Any]:
    """What a step decided: the window (as stored), the state, its flags and the counters."""
    return {
        "window": messages_to_dict(result.messages),
        "state": result.state,
        "flags": (result.changed, result.rewritten, result.cut),
        "counters": asdict(arm.keeper.counters("s")),
    }


@pytest.fixture
def same_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("keeper_middleware.sessions.state.new_secret", lambda: "5" * 64)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=operations())
def test_the_fast_path_decides_as_the_full_path(
    ops: list[tuple[str, str, int]], same_secret: None
) -> None:
    arms = (Arm(full_path=False), Arm(full_path=True))
    for number, (kind, text, pick) in enumerate(ops):
        if kind == "mutate":
            _mutate(arms, text, pick)
        for arm in arms:
            arm.apply(kind, text, number)
        fast, full = (arm.step() for arm in arms)
        assert _outcome(arms[0], fast) == _outcome(arms[1], full), f"after {kind} ({number})"
    for arm in arms:
        arm.keeper.close()


def _classified(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many messages each classification without entries to reuse was given."""
    counts: list[int] = []
    classify = entries.classify

    def counting(
        messages: Sequence[BaseMessage],
        counter: Any,
        detector: Any,
        known: Any = (),
        memo: Any = None,
    ) -> list[Entry]:
        if not known:
            counts.append(len(messages))
        return classify(messages, counter, detector, known, memo)

    monkeypatch.setattr("keeper_middleware.step.window.classify", counting)
    return counts


def _window_of(kind: str, count: int) -> Arm:
    """A session whose step took in ``count`` rounds of ``kind`` and cut nothing."""
    arm = Arm(full_path=False, config=ROOMY)
    for number in range(count):
        arm.apply(kind, f"alpha {number}", number)
    arm.step()
    return arm


def test_an_append_classifies_only_the_new_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    arm = _window_of("tool", 6)
    counts = _classified(monkeypatch)
    arm.apply("tool", "one more line", 99)
    arm.step()
    assert counts == [2]  # the call and its result; the 13 messages before them are reused


def test_a_message_changed_in_place_is_classified_again(monkeypatch: pytest.MonkeyPatch) -> None:
    arm = _window_of("input", 4)
    counts = _classified(monkeypatch)
    arm.history[2].content = "Changed in place: alpha is 7."
    arm.apply("input", "bravo", 50)
    arm.step()
    assert counts == [len(arm.history)]  # the whole window: a kept message changed
    assert arm.history[2].content == "Changed in place: alpha is 7."


def _always_whole(
    self: LastEntries,
    session: str,
    messages: Sequence[BaseMessage],
    classify: Callable[[Sequence[BaseMessage]], list[Entry]],
) -> list[Entry]:
    """The full path: nothing kept is reused."""
    self.forget(session)
    return classify(messages)


async def _through_the_proxy(ops: list[tuple[Any, ...]], folder: Path) -> None:
    fast = await incremental._run(ops, folder / "fast", incremental=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LastEntries, "classify", _always_whole)
        full = await incremental._run(ops, folder / "full", incremental=True)
    assert fast == full  # the answers, the session record after each request, the bytes sent


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(incremental.operation, min_size=1, max_size=12))
def test_through_the_proxy_the_fast_path_sends_the_same_bytes(ops: list[tuple[Any, ...]]) -> None:
    """Appends, tool rounds, edits, regenerates, truncations, trims, resends and another
    prefix, through keeper-proxy: the same session records and upstream requests, byte for
    byte, whether the keeper step reuses its last entries or classifies every window whole."""
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(_through_the_proxy(ops, Path(folder)))
