"""A step that starts from what earlier steps worked out of the messages still in view decides
exactly as a step that works everything out afresh.

Two keepers take the same random sequence of inputs, tool rounds (some with a result too big to
stay whole in view), replies, edits (a message
replaced under its id), changes made in place to a message object, removals and forks (a
conversation taken up again from an earlier step). One keeps the message objects from step to
step, as an adapter does (so what it worked out of them is reused); the other is handed fresh
copies at every step (so nothing is). Their windows, keeper states and decisions must be equal
at every step, cuts included.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from keeper_middleware import Keeper, KeeperConfig, ModelSetup
from keeper_middleware.messages.facts import keeper_kind, text_of
from keeper_middleware.messages.memo import SameMessageMemo
from keeper_middleware.step.result import StepResult

CUTTING = KeeperConfig(window=2048, reply_reserve=256, notes_every_items=3)
"""Cuts every few items or when the window fills, so a sequence makes several cuts."""
SETUP = ModelSetup(system_prompt="Keep a tally of the counters.")
WORDS = ("alpha", "bravo", "harbour", "ledger", "parcel", "overdrawn", "clerk", "mill")


def _note_call(messages: list[BaseMessage], kwargs: Any) -> AIMessage:
    return AIMessage(content="NO CHANGES")


def _text(draw: st.DrawFn, prefix: str) -> str:
    words = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=40))
    return f"{prefix} {' '.join(words)} {draw(st.integers(0, 999))}."


Op = tuple[str, Any]


@st.composite
def operations(draw: st.DrawFn) -> list[Op]:
    ops: list[Op] = []
    for number in range(draw(st.integers(4, 22))):
        kind = draw(
            st.sampled_from(
                [
                    *("input", "input", "question", "tool", "tool", "reply"),
                    *("edit", "mutate", "remove", "fork", "blocks", "big"),
                ]
            )
        )
        if kind in ("input", "question", "reply", "blocks"):
            ops.append((kind, _text(draw, f"Item {number}:")))
        elif kind == "big":  # more than a message may take in view: archived whole, excerpted
            ops.append((kind, _text(draw, "Result:") * draw(st.integers(20, 60))))
        elif kind == "tool":
            ops.append((kind, (draw(st.integers(1, 3)), _text(draw, "Result:"))))
        elif kind in ("edit", "mutate"):
            text = _text(draw, "Edited:") + draw(st.sampled_from(["", " Is it overdrawn?"]))
            ops.append((kind, (draw(st.integers(0, 10_000)), text)))
        else:
            ops.append((kind, draw(st.integers(0, 10_000))))
    return ops


def _own(message: BaseMessage) -> bool:
    return keeper_kind(message) is not None


def _edit(message: BaseMessage, text: str) -> BaseMessage:
    if isinstance(message, AIMessage) and message.tool_calls:
        calls = [{**c, "args": {"note": text}} for c in message.tool_calls]
        return message.model_copy(update={"tool_calls": calls})
    return message.model_copy(update={"content": text})


def _mutate(message: BaseMessage, text: str) -> None:
    """Change a message object in place (a caller that should not, but may)."""
    if isinstance(message, AIMessage) and message.tool_calls:
        message.tool_calls[0]["args"]["note"] = text
    elif isinstance(message.content, list) and message.content:
        block = message.content[0]
        if isinstance(block, dict):
            block["text"] = text
    else:
        message.content = text


class Arm:
    """One keeper and the conversation it runs, with every step's outcome kept for forks."""

    def __init__(self, fresh_copies: bool) -> None:
        self.keeper = Keeper(CUTTING)
        self.fresh_copies = fresh_copies
        self.history: list[BaseMessage] = []
        self.state: dict[str, Any] | None = None
        self.snapshots: list[tuple[list[BaseMessage], dict[str, Any] | None]] = []

    def step(self) -> StepResult:
        given = self.history
        if self.fresh_copies:
            given = [m.model_copy(deep=True) for m in given]
        result = self.keeper.step("s", given, self.state, SETUP, _note_call)
        self.history, self.state = list(result.messages), result.state
        self.snapshots.append((list(self.history), self.state))
        return result


def _apply(arms: tuple[Arm, Arm], op: Op, number: int) -> None:
    kind, arg = op
    for arm in arms:
        history = arm.history
        if kind == "input":
            history.append(HumanMessage(content=arg, id=f"in-{number}"))
        elif kind == "blocks":
            history.append(HumanMessage(content=[{"type": "text", "text": arg}], id=f"b-{number}"))
        elif kind == "question":
            history.append(HumanMessage(content=f"{arg} What is alpha now?", id=f"q-{number}"))
        elif kind == "reply":
            history.append(AIMessage(content=arg, id=f"r-{number}"))
        elif kind == "big":
            history.append(
                AIMessage(
                    content="",
                    id=f"a-{number}",
                    tool_calls=[{"name": "read", "args": {}, "id": f"c-{number}"}],
                )
            )
            history.append(ToolMessage(content=arg, tool_call_id=f"c-{number}", id=f"t-{number}"))
        elif kind == "tool":
            calls, text = arg
            ids = [f"c-{number}-{i}" for i in range(calls)]
            history.append(
                AIMessage(
                    content="",
                    id=f"a-{number}",
                    tool_calls=[{"name": "read", "args": {}, "id": i} for i in ids],
                )
            )
            history += [
                ToolMessage(content=f"{text} ({i})", tool_call_id=i, id=f"t-{i}") for i in ids
            ]
        elif kind == "remove":
            if history:
                del history[arg % len(history)]
        elif kind == "fork" and arm.snapshots:
            messages, state = arm.snapshots[arg % len(arm.snapshots)]
            arm.history, arm.state = list(messages), state
    if kind in ("edit", "mutate"):
        _change(arms, kind, arg)


def _change(arms: tuple[Arm, Arm], kind: str, arg: tuple[int, str]) -> None:
    """Edit a message (a new object under its id) or change it in place: the same message in
    both arms, and in place also wherever the kept arm's earlier steps share that object."""
    kept = arms[0]
    others = [i for i, m in enumerate(kept.history) if not _own(m)]
    if not others:
        return
    at = others[arg[0] % len(others)]
    if kind == "edit":
        for arm in arms:
            arm.history[at] = _edit(arm.history[at], arg[1])
        return
    target = kept.history[at]
    # every place the kept arm holds this object, mirrored in the other arm
    places = [(None, at)] + [
        (n, i)
        for n, (messages, _state) in enumerate(kept.snapshots)
        for i, m in enumerate(messages)
        if m is target
    ]
    done: set[int] = set()
    for arm in arms:
        for snapshot, index in places:
            messages = arm.history if snapshot is None else arm.snapshots[snapshot][0]
            message = messages[index]
            if id(message) not in done:
                done.add(id(message))
                _mutate(message, arg[1])


def _seen(arm: Arm, result: StepResult) -> tuple[Any, ...]:
    return (
        [m.model_dump(exclude={"response_metadata", "usage_metadata"}) for m in result.messages],
        result.state,
        result.changed,
        result.rewritten,
        result.cut,
        asdict(arm.keeper.counters("s")),
    )


def _audit(arm: Arm) -> None:
    """Whatever the kept arm's memory holds for a message in view is what it says now."""
    window = arm.keeper.window
    for message in arm.history:
        facts = window._facts.get(message)
        if facts is None:
            continue
        copy = message.model_copy(deep=True)
        if "tokens" in facts:
            assert facts["tokens"] == window.tokens.count_messages([copy]), message
        if "question" in facts:
            assert facts["question"] == window.detector.is_question(copy), message
        if "text" in facts:
            assert facts["text"] == text_of(copy), message


def _same_secret(monkeypatch: pytest.MonkeyPatch) -> Callable[[], str]:
    secret = "5" * 64
    monkeypatch.setattr("keeper_middleware.sessions.state.new_secret", lambda: secret)
    return lambda: secret


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=operations())
def test_a_step_reusing_what_it_worked_out_decides_as_one_working_it_all_out(
    ops: list[Op], monkeypatch: pytest.MonkeyPatch
) -> None:
    _same_secret(monkeypatch)
    arms = (Arm(fresh_copies=False), Arm(fresh_copies=True))
    arms[0].history = [HumanMessage(content="Tally every counter you read.", id="task")]
    arms[1].history = [HumanMessage(content="Tally every counter you read.", id="task")]
    for number, op in enumerate(ops):
        _apply(arms, op, number)
        kept, fresh = arms[0].step(), arms[1].step()
        assert _seen(arms[0], kept) == _seen(arms[1], fresh), f"after {op[0]} (step {number})"
        _audit(arms[0])
    for arm in arms:
        arm.keeper.close()


def test_the_sequences_make_cuts_and_reuse_what_was_worked_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The property above is only worth something if its sequences cut and if the kept arm
    really reuses: both are checked on one long sequence."""
    _same_secret(monkeypatch)
    arm = Arm(fresh_copies=False)
    arm.history = [HumanMessage(content="Tally every counter you read.", id="task")]
    cuts = 0
    for number in range(30):
        arm.history.append(
            HumanMessage(content=f"Item {number}: alpha {number}.", id=f"in-{number}")
        )
        result = arm.step()
        cuts += result.cut
        if not result.cut:  # what the step worked out of its messages is kept for the next one
            assert arm.keeper.window._facts.get(arm.history[-1]) is not None
    assert cuts >= 3


def test_a_message_changed_in_place_is_worked_out_afresh() -> None:
    memo: SameMessageMemo[int] = SameMessageMemo()
    call = AIMessage(content="", id="a", tool_calls=[{"name": "t", "args": {}, "id": "c"}])
    parts = HumanMessage(content=[{"type": "text", "text": "one"}], id="h")
    plain = ToolMessage(content="r", tool_call_id="c", id="t")
    for message in (call, parts, plain):
        memo.put(message, 1)
        assert memo.get(message) == 1
    call.tool_calls[0]["args"]["x"] = 1
    parts.content[0]["text"] = "two"  # type: ignore[index]
    plain.content = "s"
    plain_copy = plain.model_copy(update={"content": "r"})
    assert [memo.get(m) for m in (call, parts, plain, plain_copy)] == [None, None, None, None]


def test_a_message_that_is_gone_takes_its_answers_with_it() -> None:
    memo: SameMessageMemo[int] = SameMessageMemo()
    messages = [HumanMessage(content=f"m{i}", id=str(i)) for i in range(50)]
    for message in messages:
        memo.put(message, 1)
    assert len(memo) == 50
    del messages, message
    gc.collect()
    assert len(memo) == 0
