"""A model that reads a sign the wrong way is asked again, and a flip it keeps never enters the notes.

Measured before this check: a reader that misread one sign in three notes requests left ten wrong
lines in the notes and was never asked again, because every amount it used was in the text.
"""

from __future__ import annotations

from langchain_core.messages import BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from keeper_middleware import Keeper, KeeperConfig, create_keeper_agent
from keeper_middleware.messages.facts import keeper_kind, text_of
from tests.fake_model import ScriptedChatModel
from tests.story_model import batch

THREAD = {"configurable": {"thread_id": "t1"}}
CONFIG = KeeperConfig(window=4096, reply_reserve=256, notes_every_items=2)
STORIES = (
    "Mira Holt recorded domo86 at three hundred and forty-two.",
    "Ten were taken from domo86 by Tomas Quill.",
)


class SignFlipper:
    """Writes the notes with one sign flipped; from the ``honest_after``-th notes call on, right."""

    def __init__(self, flipped: str, right: str, honest_after: int | None) -> None:
        self.flipped, self.right, self.honest_after = flipped, right, honest_after
        self.note_calls: list[list[BaseMessage]] = []

    def __call__(self, messages: list[BaseMessage]) -> str:
        if keeper_kind(messages[-1]) not in ("notes_request", "notes_reask"):
            return "ok"
        self.note_calls.append(messages)
        honest = self.honest_after is not None and len(self.note_calls) > self.honest_after
        return self.right if honest else self.flipped


def run(model: SignFlipper) -> Keeper:
    keeper = Keeper(CONFIG)
    agent = create_keeper_agent(
        ScriptedChatModel(default=model), keeper=keeper, checkpointer=InMemorySaver()
    )
    agent.invoke({"messages": [HumanMessage("Task: read the items.")]}, THREAD)
    for item, story in enumerate(STORIES, start=1):
        agent.invoke({"messages": [HumanMessage(batch(item, story))]}, THREAD)
    return keeper


def test_a_value_read_with_the_wrong_sign_is_asked_again_and_corrected():
    model = SignFlipper(
        flipped="SET domo86 = -352 (= -342 - 10)",
        right="SET domo86 = 332 (= 342 - 10)",
        honest_after=1,
    )
    keeper = run(model)
    assert keeper.notes("t1").state_dict() == {"domo86": "332"}
    assert keeper.counters("t1").reasks == 1
    reask = text_of(model.note_calls[1][-1])
    assert "-342" in reask and "the sign is wrong" in reask


def test_a_take_worked_as_an_add_is_asked_again_and_corrected():
    model = SignFlipper(
        flipped="SET domo86 = 352 (= 342 + 10)",
        right="SET domo86 = 332 (= 342 - 10)",
        honest_after=1,
    )
    keeper = run(model)
    assert keeper.notes("t1").state_dict() == {"domo86": "332"}
    assert "the turns take 10, but the working adds it" in text_of(model.note_calls[1][-1])


def test_a_flip_the_model_never_corrects_is_left_out_not_kept():
    model = SignFlipper(
        flipped="SET domo86 = -342\nSET domo86 = -352 (= -342 - 10)",
        right="",
        honest_after=None,
    )
    keeper = run(model)
    assert "domo86" not in keeper.notes("t1").state_dict()
    assert keeper.counters("t1").reasks == CONFIG.max_reasks
