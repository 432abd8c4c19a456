"""Item numbers as real inputs state them: restarting, jumping, going back, or too big to
store. None of it raises, the cadence keeps taking notes, and a pattern whose group can
capture something other than digits is refused when the configuration is made."""

from __future__ import annotations

import pytest
from langchain_core.messages import BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from keeper_middleware import ConfigurationError, Keeper, KeeperConfig, create_keeper_agent
from keeper_middleware.messages.facts import keeper_kind
from keeper_middleware.step.items import ItemNumbering
from tests.fake_model import ScriptedChatModel

THREAD = {"configurable": {"thread_id": "t1"}}


def notes_or_ok(messages: list[BaseMessage]) -> str:
    if keeper_kind(messages[-1]) in ("notes_request", "notes_reask"):
        return "NO CHANGES"
    return "ok"


@pytest.mark.parametrize(
    "numbers",
    [
        [1, 2, 999, 1000, 1001, 21, 22, 23, 24, 25, 26],  # a heading quoted a big number
        [5, 6, 7, 1, 2, 3, 1, 2, 3, 4],  # a queue that restarts
        [1, 50_000, 3, 2**70, 4, 5, 6],  # jumps, and a number no column can hold
    ],
    ids=["backwards", "restarts", "jumps"],
)
def test_numbering_that_goes_back_never_raises_and_the_cadence_keeps_cutting(numbers):
    keeper = Keeper(KeeperConfig(window=4096, reply_reserve=512, notes_every_items=3))
    agent = create_keeper_agent(
        ScriptedChatModel(default=notes_or_ok), keeper=keeper, checkpointer=InMemorySaver()
    )
    agent.invoke({"messages": [HumanMessage("Task: keep the values.")]}, THREAD)
    for n in numbers:
        agent.invoke({"messages": [HumanMessage(f"Item {n}. c{n % 97} is {n % 13}.")]}, THREAD)
    assert keeper.counters("t1").cuts >= len(numbers) // 3 - 1
    items = {t.item for t in keeper.archive.turns("t1") if t.content.startswith("Item ")}
    assert items <= {*(n for n in numbers if n < 2**53), *range(0, 200)}


def test_a_state_saved_before_items_were_counted_still_cuts_on_cadence():
    keeper = Keeper(KeeperConfig(window=4096, reply_reserve=512, notes_every_items=2))
    calls: list[int] = []

    def call(messages, kwargs):
        calls.append(len(messages))
        from langchain_core.messages import AIMessage

        return AIMessage("NO CHANGES")

    from keeper_middleware import ModelSetup

    old_state = {
        "seen": ["h0"],
        "items": {"h0": 7},
        "last_item": 7,
        "notes_item": 9,
        "numbered": True,
    }
    from keeper_middleware.archive.records import NotesDraft

    # the cut that state remembers (notes up to item 9), as the archive holds it
    notes = NotesDraft(first_item=1, last_item=9, text="[NOTES]", data_json="{}")
    keeper.archive.commit_cut("s", cut_key="earlier", turns=[], notes=notes)
    messages = [HumanMessage("Task.", id="h0"), HumanMessage("Item 3. x is 1.", id="h1")]
    result = keeper.step("s", messages, old_state, ModelSetup(), call)  # 7 - 9 < 0 raised
    assert [m.id for m in result.messages] == ["h0", "h1"]
    assert result.state["items_since_notes"] == 1 and result.state["last_item"] == 3


def test_an_item_pattern_whose_group_is_not_a_number_is_refused_at_once():
    for pattern in (r"^Item (\w+)", r"^Item (\d*)", r"^Item (-?\d+)", r"^Item (\d+|next)"):
        with pytest.raises(ConfigurationError, match=r"item_pattern=.*capture digits only"):
            KeeperConfig(item_pattern=pattern)
    for pattern in (r"^Item ([0-9]{1,6})", r"^(?:Item|Ticket) #?(\d+)\b", r"(?P<n>\d+)\."):
        KeeperConfig(item_pattern=pattern)


def test_a_group_that_takes_no_part_gives_no_number():
    numbering = ItemNumbering(r"^Item (\d+)|^Ticket")
    assert numbering.stated_number(HumanMessage("Ticket for the parser")) is None
    assert numbering.stated_number(HumanMessage("Item 12. go")) == 12
    assert numbering.stated_number(HumanMessage(f"Item {2**70}. go")) is None
