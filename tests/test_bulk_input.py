"""History imported at once: a step makes as many cuts as the window needs.

600 messages in one invoke used to raise ``WindowTooSmallError`` on that call and every later one
(a step made one cut, then refused the window it left), and 20,000 did not return in five
minutes (shrinking recounted the whole window after each message). Now the history not yet
noted is taken in parts that each fit one note request, a cut each, in one pass.
"""

from __future__ import annotations

import asyncio
import re

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver

from keeper_middleware import Keeper, KeeperConfig, ModelSetup, create_keeper_agent
from keeper_middleware.integrations.langchain import KeeperMiddleware
from keeper_middleware.messages.facts import keeper_kind, text_of
from keeper_middleware.notes.budget import MOVED_TURN_NAME
from tests.fake_model import ScriptedChatModel

THREAD = {"configurable": {"thread_id": "t1"}}
CONFIG = KeeperConfig(window=8192, reply_reserve=1024)
RULE = "Always give amounts in euros."


def imported(pairs: int, *, tools_every: int = 0) -> list[BaseMessage]:
    """A conversation exported from elsewhere: a task, then items and replies (and, every
    ``tools_every`` items, a tool round with two parallel results)."""
    history: list[BaseMessage] = [HumanMessage(f"Task: keep the ledger. {RULE}")]
    for i in range(1, pairs + 1):
        history.append(HumanMessage(f"Item {i}. The clerk recorded c{i} at {i * 3}."))
        if tools_every and i % tools_every == 0:
            calls = [
                {"name": "look", "args": {"what": f"c{i}"}, "id": f"l{i}a"},
                {"name": "look", "args": {"what": f"c{i - 1}"}, "id": f"l{i}b"},
            ]
            history.append(AIMessage("", tool_calls=calls))
            history += [
                ToolMessage(f"c{i} looked fine.", tool_call_id=f"l{i}a", name="look"),
                ToolMessage(f"c{i - 1} looked fine.", tool_call_id=f"l{i}b", name="look"),
            ]
        history.append(AIMessage(f"Noted c{i} at {i * 3}."))
    return history


def noting(messages: list[BaseMessage]) -> str:
    """Notes every value of the turns it is asked about, and the rule when it sees it."""
    if keeper_kind(messages[-1]) not in ("notes_request", "notes_reask"):
        return "ok"
    start = (
        max(i for i, m in enumerate(messages) if keeper_kind(m) == "notes") + 1
        if any(keeper_kind(m) == "notes" for m in messages)
        else 0
    )
    seen = "\n".join(text_of(m) for m in messages[start:-1])
    lines = [f"SET c{n} = {v}" for n, v in re.findall(r"recorded c(\d+) at (\d+)\.", seen)]
    if RULE in "\n".join(text_of(m) for m in messages):
        lines.append(f"RULE: {RULE}")
    return "\n".join(lines) or "NO CHANGES"


def check(keeper: Keeper, model: ScriptedChatModel, history: list[BaseMessage], view) -> None:
    for received in model.received:
        size = keeper.tokens.count_messages(received.messages)
        assert size <= keeper.config.budget, f"a request of {size} tokens went out"
    turns = list(keeper.archive.turns("t1"))
    ids = [t.msg_id for t in turns]
    assert len(ids) == len(set(ids)), "a turn was archived twice"
    archived = [t.content for t in turns]
    shown = {text_of(m) for m in view}
    for message in history:
        text = text_of(message)
        if text:
            assert text in archived or text in shown, f"lost: {text[:60]!r}"
    notes = keeper.notes("t1")
    assert RULE in notes.rules
    noted = {key for key, _ in notes.state}
    in_archive = {t.content for t in turns if t.name == MOVED_TURN_NAME}
    assert noted or in_archive


def test_600_messages_imported_at_once_are_archived_and_noted_in_several_cuts():
    keeper = Keeper(CONFIG)
    model = ScriptedChatModel(default=noting)
    agent = create_keeper_agent(model, keeper=keeper, checkpointer=InMemorySaver())
    history = imported(300)
    out = agent.invoke({"messages": history}, THREAD)
    assert keeper.counters("t1").cuts >= 2
    requests = [r for r in model.received if keeper_kind(r.messages[-1]) == "notes_request"]
    assert len(requests) == keeper.counters("t1").cuts  # one note request a cut
    check(keeper, model, history, out["messages"])
    # every value that left the window was noted: it is in the NOTES, or moved from them
    notes = dict(keeper.notes("t1").state)
    moved = "\n".join(t.content for t in keeper.archive.turns("t1") if t.name == MOVED_TURN_NAME)
    left = [t.content for t in keeper.archive.turns("t1") if t.content.startswith("Item ")]
    assert len(left) >= 200
    for text in left:
        key = re.search(r"recorded (c\d+) at", text).group(1)
        assert key in notes or f"{key} = " in moved or f"{key}:" in moved, f"{key} not noted"
    later = agent.invoke({"messages": [HumanMessage("Item 301. c301 was recorded at 1.")]}, THREAD)
    assert text_of(later["messages"][-1]) == "ok"


def test_an_import_with_parallel_tool_rounds_never_splits_a_call_from_its_results():
    keeper = Keeper(CONFIG)
    model = ScriptedChatModel(default=noting)
    agent = create_keeper_agent(model, keeper=keeper, checkpointer=InMemorySaver())
    history = imported(250, tools_every=5)
    out = agent.invoke({"messages": history}, THREAD)
    check(keeper, model, history, out["messages"])
    for received in model.received:
        answered = {m.tool_call_id for m in received.messages if isinstance(m, ToolMessage)}
        for message in received.messages:
            if isinstance(message, AIMessage):
                assert {c["id"] for c in message.tool_calls} <= answered


def test_an_import_ending_with_an_open_question_keeps_the_question_in_view():
    keeper = Keeper(CONFIG)
    model = ScriptedChatModel(default=noting)
    agent = create_keeper_agent(model, keeper=keeper, checkpointer=InMemorySaver())
    history = [*imported(300), HumanMessage("Questions: what is c7 now?")]
    agent.invoke({"messages": history}, THREAD)
    notes = ("notes_request", "notes_reask")
    work_calls = [r for r in model.received if keeper_kind(r.messages[-1]) not in notes]
    sent = work_calls[-1].messages
    question = [i for i, m in enumerate(sent) if text_of(m) == "Questions: what is c7 now?"]
    assert question, "the open question left the window"
    beside = [keeper_kind(m) for m in sent[question[0] + 1 :]]
    assert "rules" in beside, "the rules are not beside the question"


def test_the_async_step_cuts_the_same_parts():
    history = imported(300)
    sync_keeper, async_keeper = Keeper(CONFIG), Keeper(CONFIG)

    def call(messages, kwargs):
        return AIMessage(noting(messages))

    async def acall(messages, kwargs):
        return AIMessage(noting(messages))

    done = sync_keeper.step("t1", history, None, ModelSetup(), call)
    also = asyncio.run(async_keeper.astep("t1", history, None, ModelSetup(), acall))
    assert done.cut and also.cut
    assert [text_of(m) for m in done.messages] == [text_of(m) for m in also.messages]
    assert sync_keeper.counters("t1").cuts == async_keeper.counters("t1").cuts >= 2
    assert sync_keeper.archive.turn_count("t1") == async_keeper.archive.turn_count("t1")


def test_an_import_through_the_middleware_is_noted_in_parts():
    keeper = Keeper(CONFIG)
    model = ScriptedChatModel(default=noting)
    middleware = KeeperMiddleware(model, keeper=keeper)
    agent = create_agent(model, middleware=[middleware], checkpointer=InMemorySaver())
    history = imported(300)
    out = agent.invoke({"messages": history}, THREAD)
    assert keeper.counters("t1").cuts >= 2
    check(keeper, model, history, out["messages"])


@pytest.mark.parametrize("pairs", [2_000])
def test_thousands_of_messages_at_once_finish_in_one_step(pairs):
    keeper = Keeper(CONFIG)
    history = imported(pairs)
    result = keeper.step("t1", history, None, ModelSetup(), lambda m, k: AIMessage(noting(m)))
    assert result.cut
    assert keeper.counters("t1").cuts >= pairs // 150
    assert keeper.tokens.count_messages(result.messages) <= CONFIG.budget
    archived = keeper.archive.turn_count("t1")
    assert archived + len(result.messages) >= len(history)


class Tally:
    """A token counter that counts its own work: how many messages it was asked to size."""

    def __init__(self) -> None:
        from keeper_middleware.tokens.counting import ApproximateTokenCounter

        self.inner = ApproximateTokenCounter()
        self.messages = 0

    def count_messages(self, messages, tools=()):
        self.messages += len(messages)
        return self.inner.count_messages(messages, tools)

    def count_text(self, text: str) -> int:
        return self.inner.count_text(text)


def test_counting_grows_linearly_with_the_messages_imported():
    """Work measured without a clock: the messages sized per message imported stay the same
    from 600 to 8,000 messages (each was sized after every shrink: quadratic)."""
    per_message = []
    for pairs in (300, 4_000):
        tally = Tally()
        keeper = Keeper(CONFIG, token_counter=tally)
        history = imported(pairs)
        keeper.step("t1", history, None, ModelSetup(), lambda m, k: AIMessage(noting(m)))
        per_message.append(tally.messages / len(history))
    assert per_message[1] <= per_message[0] * 1.2, per_message
