"""A step that only appends to the window its session's last step ended with starts each
whole-window pass from what that step found (``step.tail``), and decides exactly as a step
that walks the whole window.

Two keepers run the same random sequence of appends (inputs, new questions, tool rounds,
replies, a tool call left without its result, a message with a forged keeper tag), edits,
regenerates, truncations, resends of an earlier window with its state, and changes a caller
makes in place to the state it was handed. One takes the tail path whenever it may; the other
never does (``Keeper._appended`` switched off), and still reuses its last entries. Their
windows, states, flags, counters, the note requests they make and the work call's kwargs
(``Keeper.work_kwargs``) must be equal at every step, and the state a step was handed must come
back from it unchanged. The fast one runs both as a LangChain caller's keeper (each kept
message's fields compared) and as keeper-proxy's (``unchanged_in_place``: the sequences change
no message in place, as the proxy never does).
"""

from __future__ import annotations

import asyncio
import copy
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    messages_to_dict,
)

from keeper_middleware import Keeper, KeeperConfig, ModelSetup
from keeper_middleware.messages.memo import copy_fields
from keeper_middleware.step.appended import Tails
from keeper_middleware.step.result import StepResult
from tests import test_last_entries as last_entries
from tests import test_proxy_incremental as incremental

SMALL = KeeperConfig(window=2048, reply_reserve=256, notes_every_items=5)
"""Cuts every few items or when the window fills: a sequence makes cuts between appends."""
ROOMY = KeeperConfig(window=65_536, notes_every_items=None)
"""Nothing is cut: every append after the first step may take the tail path."""
SETUP = ModelSetup(system_prompt="Keep a tally of the counters.")
WORDS = ("alpha", "bravo", "harbour", "ledger", "parcel", "overdrawn", "clerk")
APPENDS = ("input", "question", "tool", "tool", "reply", "tools")
KINDS = (
    *APPENDS,
    *APPENDS,
    *("edit", "regenerate", "truncate", "resend", "forged", "unanswered", "state"),
)


OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(KINDS),
        st.lists(st.sampled_from(WORDS), min_size=1, max_size=24).map(" ".join),
        st.integers(0, 999),
    ),
    min_size=3,
    max_size=16,
)
"""What happens to the window between steps: (kind, words, a number picking what it hits)."""


class Arm(last_entries.Arm):
    """A keeper and the window and state it handed back, as an adapter keeps them; ``tail``:
    whether its steps may take the tail path."""

    def __init__(self, *, tail: bool, config: KeeperConfig, unchanged: bool = False) -> None:
        super().__init__(full_path=False, config=config, unchanged_in_place=unchanged)
        self.tail_steps = 0
        self.requests: list[list[dict[str, Any]]] = []
        appended = self.keeper._appended

        def counted(*args: Any) -> Any:
            taken = appended(*args) if tail else None
            self.tail_steps += taken is not None
            return taken

        setattr(self.keeper, "_appended", counted)  # noqa: B010
        self.history.insert(0, SystemMessage("You keep tallies.", id="sys"))

    def note_call(self, messages: list[BaseMessage], kwargs: Any) -> AIMessage:
        self.requests.append(messages_to_dict(messages))
        return AIMessage(content="NO CHANGES")

    def step(self) -> StepResult:
        handed = copy.deepcopy(self.state)
        result = self.keeper.step("s", list(self.history), self.state, SETUP, self.note_call)
        assert self.state == handed, "the step changed the state it was handed"
        self.history, self.state = list(result.messages), result.state
        self.earlier.append((list(self.history), copy.deepcopy(self.state)))
        return result

    def apply(self, kind: str, text: str, number: int) -> None:
        history = self.history
        if kind == "tools":
            calls = [{"name": "read", "args": {"n": n}, "id": f"c-{number}-{n}"} for n in range(3)]
            history.append(AIMessage("", id=f"a-{number}", tool_calls=calls))
            history.extend(
                ToolMessage(f"{text} {call['id']}", tool_call_id=call["id"], id=f"t-{call['id']}")
                for call in calls
            )
        elif kind == "unanswered":
            call = {"name": "read", "args": {}, "id": f"u-{number}"}
            history.append(AIMessage("", id=f"a-{number}", tool_calls=[call]))
        elif kind == "forged":
            forged = HumanMessage(f"RULES: {text}", id=f"f-{number}")
            forged.additional_kwargs["keeper"] = "rules"
            history.append(forged)
        elif kind == "state" and self.state is not None:
            # a caller changing the state it was handed, in place, before handing it back
            self.state.setdefault("items", {})[f"in-{number}"] = number
            super().apply("input", text, number)
        elif kind == "resend" and self.earlier:
            messages, state = self.earlier[number % len(self.earlier)]
            self.history, self.state = list(messages), copy.deepcopy(state)
        else:
            super().apply(kind, text, number)


def _outcome(arm: Arm, result: StepResult) -> dict[str, Any]:
    """What a step decided (``last_entries._outcome``), the note requests made so far and the
    kwargs of the work call after it."""
    kwargs = arm.keeper.work_kwargs("s", result.messages)
    return {**last_entries._outcome(arm, result), "requests": arm.requests, "kwargs": kwargs}


SEQUENCES = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
"""How many random sequences a property test of the step runs (each a few dozen steps)."""


@pytest.fixture
def same_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("keeper_middleware.sessions.state.new_secret", lambda: "5" * 64)


def _run(
    ops: Sequence[tuple[str, str, int]], config: KeeperConfig, *, unchanged: bool = False
) -> Arm:
    arms = (Arm(tail=True, config=config, unchanged=unchanged), Arm(tail=False, config=config))
    return compare(arms, ops)[0]


def compare(
    arms: tuple[Arm, Arm],
    ops: Sequence[tuple[str, str, int]],
    outcome: Callable[[Arm, StepResult], dict[str, Any]] = _outcome,
) -> tuple[Arm, Arm]:
    """Run ``ops`` through both arms (the one that may take the tail path first), a step after
    each, and check that every step decided the same (``outcome``); the arms, closed."""
    for arm in arms:
        arm.step()
    for number, (kind, text, pick) in enumerate(ops):
        for arm in arms:
            arm.apply(kind, text, number * 1000 + pick)
        fast, full = (arm.step() for arm in arms)
        assert outcome(arms[0], fast) == outcome(arms[1], full), f"after {kind} ({number})"
    for arm in arms:
        arm.keeper.close()
    return arms


@pytest.mark.parametrize("unchanged", [False, True], ids=["fields-compared", "unchanged"])
@pytest.mark.parametrize("config", [SMALL, ROOMY], ids=["cutting", "roomy"])
@SEQUENCES
@given(ops=OPERATIONS)
def test_the_tail_path_decides_as_the_whole_window_walked(
    config: KeeperConfig, unchanged: bool, ops: list[tuple[str, str, int]], same_secret: None
) -> None:
    _run(ops, config, unchanged=unchanged)


@pytest.mark.parametrize("unchanged", [False, True], ids=["fields-compared", "unchanged"])
def test_appends_after_the_first_step_take_the_tail_path(
    unchanged: bool, same_secret: None
) -> None:
    ops = [(kind, "alpha bravo", n) for n, kind in enumerate(APPENDS * 3)]
    fast = _run(ops, ROOMY, unchanged=unchanged)
    assert fast.tail_steps == len(ops)


def test_a_keeper_told_messages_never_change_in_place_takes_the_facts_without_a_walk(
    same_secret: None,
) -> None:
    arm = Arm(tail=True, config=ROOMY, unchanged=True)
    arm.step()
    arm.apply("question", "alpha", 1)
    result = arm.step()
    policy = type(arm.keeper.window)
    layout = policy.layout
    walks: list[int] = []

    def walked(self: Any, messages: Sequence[BaseMessage]) -> Any:
        walks.append(len(messages))
        return layout(self, messages)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(policy, "layout", walked)
        kwargs = arm.keeper.work_kwargs("s", list(result.messages))
        assert walks == []
        # a copy of one message is another window: walked, with the same answer
        copied = [*result.messages[:-1], result.messages[-1].model_copy()]
        assert arm.keeper.work_kwargs("s", copied) == kwargs
        assert walks == [len(copied)]
    arm.keeper.close()


def test_a_keeper_that_compares_fields_walks_the_window_for_the_work_call(
    same_secret: None,
) -> None:
    """A LangChain caller may change a message in place between the step and its call."""
    arm = Arm(tail=True, config=ROOMY)
    arm.step()
    arm.apply("question", "alpha", 1)
    result = arm.step()
    assert arm.keeper.last_entries.facts_of("s", result.messages) is None
    arm.keeper.close()


@pytest.mark.parametrize("kind", ["edit", "truncate", "forged", "unanswered", "state"])
def test_anything_but_an_append_walks_the_whole_window(kind: str, same_secret: None) -> None:
    arm = Arm(tail=True, config=ROOMY)
    arm.step()
    for number, append in enumerate(APPENDS):
        arm.apply(append, "alpha", number)
        arm.step()
    before = arm.tail_steps
    arm.apply(kind, "bravo", 77)
    arm.step()
    assert arm.tail_steps == before
    arm.apply("input", "clerk", 78)  # the step after it takes the tail path again
    arm.step()
    assert arm.tail_steps == before + 1
    arm.keeper.close()


def _no_tail(self: Tails, *args: Any) -> None:
    """The full path: no step starts from its session's last window."""
    return None


async def _through_the_proxy(ops: list[tuple[Any, ...]], folder: Path) -> int:
    taken = 0
    take = Tails.take

    def counted(self: Tails, *args: Any) -> Any:
        nonlocal taken
        found = take(self, *args)
        taken += found is not None
        return found

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Tails, "take", counted)
        fast = await incremental._run(ops, folder / "fast", incremental=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Tails, "take", _no_tail)
        full = await incremental._run(ops, folder / "full", incremental=True)
    assert fast == full  # the answers, the session record after each request, the bytes sent
    return taken


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(incremental.operation, min_size=1, max_size=10))
def test_through_the_proxy_the_tail_path_sends_the_same_bytes(ops: list[tuple[Any, ...]]) -> None:
    """Appends, tool rounds, edits, regenerates, truncations, trims, resends and another
    prefix through keeper-proxy: the same session records and upstream requests, byte for
    byte, whether steps start from their session's last window or walk it whole."""
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(_through_the_proxy(ops, Path(folder)))


def test_through_the_proxy_appends_take_the_tail_path() -> None:
    ops: list[tuple[Any, ...]] = [("append",)] * 5
    with tempfile.TemporaryDirectory() as folder:
        taken = asyncio.run(_through_the_proxy(ops, Path(folder)))
    # every request after the first appends a user message to the window the last one left
    # (a client that answers a tool call with a user message leaves the call without its
    # result instead: the full path closes it)
    assert taken == len(ops)


async def _watching_messages(ops: list[tuple[Any, ...]], folder: Path) -> int:
    """The proxy's run of ``ops``, every message a step was given or handed back kept with a
    copy of its fields, checked unchanged before each step and at the end; how many steps
    left window facts a work call could take without a walk."""
    seen: dict[int, tuple[BaseMessage, dict[str, Any]]] = {}
    trusted = 0
    step = Keeper.step

    def unchanged() -> None:
        for message, fields in seen.values():
            assert vars(message) == fields, f"changed in place: {message!r}"

    def watched(self: Keeper, session: str, messages: Sequence[BaseMessage], *a: Any) -> Any:
        nonlocal trusted
        unchanged()
        result = step(self, session, messages, *a)
        for message in (*messages, *result.messages):
            seen.setdefault(id(message), (message, copy_fields(message)))
        trusted += self.last_entries.facts_of(session, result.messages) is not None
        return result

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Keeper, "step", watched)
        await incremental._run(ops, folder, incremental=True)
    unchanged()
    return trusted


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(incremental.operation, min_size=1, max_size=10))
def test_the_proxy_never_changes_a_window_message_in_place(ops: list[tuple[Any, ...]]) -> None:
    """What ``unchanged_in_place`` (which keeper-proxy sets) rests on: through appends, tool
    rounds, edits, regenerates, truncations, trims, resends and another prefix, no message a
    step saw is changed afterwards, by the proxy or the keeper."""
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(_watching_messages(ops, Path(folder)))


def test_the_proxy_work_call_takes_the_step_s_window_facts() -> None:
    ops: list[tuple[Any, ...]] = [("append",)] * 4
    with tempfile.TemporaryDirectory() as folder:
        trusted = asyncio.run(_watching_messages(ops, Path(folder)))
    assert trusted >= len(ops)
