"""A careful summariser's guard, and every version of a summarising arm's memory audited."""

from __future__ import annotations

from uuid import uuid4

from langchain_core.messages import HumanMessage, SystemMessage

from keeper_bench.arms import build_arm
from keeper_bench.recording import CallRecorder
from keeper_middleware.graphs.baselines import SUMMARY_HEADER, SUMMARY_REQUEST_TAG, is_summary
from keeper_middleware.messages.facts import text_of
from tests.fake_model import ScriptedChatModel


def _batches(count: int) -> list[str]:
    filler = "The quiet ferryman walked past the mill at dawn. " * 60
    return [f"Item {n}.\nMira Holt recorded domo{n:02d} at {n}. {filler}" for n in range(1, count)]


def _run(replies: list[str]) -> tuple[list, ScriptedChatModel]:
    """The summarize arm on batches that fill a 4K window, its summaries scripted."""
    script = iter(replies)

    def reply(messages):  # type: ignore[no-untyped-def]
        last = text_of(messages[-1])
        if last.startswith(SUMMARY_REQUEST_TAG):
            return next(script)
        return "Read."

    model = ScriptedChatModel(default=reply)
    arm = build_arm("summarize", model, window=4096)
    config = {"configurable": {"thread_id": "t"}}
    state: dict = {}
    for text in _batches(12):
        state = arm.graph.invoke({"messages": [HumanMessage(text)]}, config)
    return state["messages"], model


def test_an_empty_summary_is_asked_for_again_and_never_replaces_the_turns():
    messages, model = _run(["", "item 3: domo03 stood at 3."] + ["item 9: domo09 stood at 9."] * 9)
    summaries = [m for m in messages if is_summary(m)]
    assert summaries and "domo" in text_of(summaries[0])
    asked = [
        m
        for call in model.received
        for m in call.messages[-1:]
        if SUMMARY_REQUEST_TAG in text_of(m)
    ]
    assert any("Your reply was empty" in text_of(m) for m in asked)


def test_two_empty_summaries_replace_nothing():
    messages, _ = _run([""] * 40)
    assert not any(is_summary(m) for m in messages)
    assert any(text_of(m).startswith("Item 11.") for m in messages)  # the newest turns stay


def test_every_summary_a_work_call_carries_is_a_version_an_empty_one_included():
    saved: list[tuple[int, str]] = []
    recorder = CallRecorder(summary_sink=lambda item, text: saved.append((item, text)))

    def call(*messages):  # type: ignore[no-untyped-def]
        run = uuid4()
        recorder.on_chat_model_start({}, [list(messages)], run_id=run)

    asked = HumanMessage(f"{SUMMARY_REQUEST_TAG} Write a summary.\nItem 4.\nItem 5.")
    call(SystemMessage("s"), asked)
    carried = HumanMessage(f"{SUMMARY_HEADER}\nitem 5: domo05 stood at 5.")
    call(SystemMessage("s"), carried, HumanMessage("Item 6."))
    call(SystemMessage("s"), carried, HumanMessage("Item 7."))  # the same memory: no new version
    call(SystemMessage("s"), HumanMessage(f"{SUMMARY_REQUEST_TAG} Again.\nItem 8."))
    call(SystemMessage("s"), HumanMessage("Here is a summary of the conversation to date:\n\n"))
    assert saved == [(5, "item 5: domo05 stood at 5."), (8, "")]
