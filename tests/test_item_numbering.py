"""Item numbers as real inputs state them: restarting, jumping, going back, or too big to
store. None of it raises, the cadence keeps taking notes, and a pattern whose group can
capture something other than digits is refused when the configuration is made."""

from __future__ import annotations

from dataclasses import replace

import pytest
from langchain_core.messages import BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from keeper_middleware import ConfigurationError, Keeper, KeeperConfig, create_keeper_agent
from keeper_middleware.messages.facts import keeper_kind
from keeper_middleware.step.items import Counting, ItemNumbering, renumber
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


def _feed_entries(keeper: Keeper, heads: list[str]) -> None:
    """The task, then one input per head with a question set after every third."""
    agent = create_keeper_agent(
        ScriptedChatModel(default=notes_or_ok), keeper=keeper, checkpointer=InMemorySaver()
    )
    agent.invoke({"messages": [HumanMessage("Task: keep the values.")]}, THREAD)
    for n, head in enumerate(heads, start=1):
        agent.invoke({"messages": [HumanMessage(f"{head}\nc{n} is {n * 3}.")]}, THREAD)
        if n % 3 == 0:
            agent.invoke({"messages": [HumanMessage(f"Questions:\n1. What is c{n}?")]}, THREAD)


def _archived_items(keeper: Keeper) -> dict[str, int | None]:
    return {
        t.content.split("\n")[1]: t.item for t in keeper.archive.turns("t1") if "\nc" in t.content
    }


def test_inputs_that_open_with_their_own_head_count_in_its_numbers_not_per_question_set():
    keeper = Keeper(KeeperConfig(window=4096, reply_reserve=512, notes_every_items=3))
    _feed_entries(keeper, [f"Entry {n}." for n in range(1, 19)])
    archived = _archived_items(keeper)
    assert len(archived) >= 9
    # "c12 is 36." came in "Entry 12.": the archive (and so the search) says item 12, though
    # four question sets came before it
    assert all(item == int(line.split(" ")[0][1:]) for line, item in archived.items())
    assert keeper.counters("t1").cuts >= 4  # the cadence counts entries, as with "Item N."


def test_a_head_whose_number_does_not_rise_by_one_is_not_learned():
    keeper = Keeper(KeeperConfig(window=4096, reply_reserve=512, notes_every_items=3))
    _feed_entries(keeper, [f"Page {n * 2} of the log." for n in range(1, 13)])
    archived = _archived_items(keeper)
    # numbered by the keeper: the task is item 1, and each question set is an item of its own
    assert archived["c1 is 3."] == 2 and archived["c4 is 12."] == 6


def test_learning_heads_can_be_turned_off():
    config = KeeperConfig(window=4096, reply_reserve=512, notes_every_items=3)
    keeper = Keeper(replace(config, learn_item_heads=False))
    _feed_entries(keeper, [f"Entry {n}." for n in range(1, 13)])
    assert _archived_items(keeper)["c4 is 12."] == 6


def test_the_input_before_the_head_was_learned_takes_its_stated_number():
    numbering = ItemNumbering(KeeperConfig().item_pattern)
    counting, items = Counting(), {}
    for msg_id, text, question in [
        ("task", "Task: keep the values.", False),
        ("e5", "Entry 5.\nc1 is 3.", False),
        ("q", "Questions:\n1. What is c1?", True),
        ("e6", "Entry 6.\nc2 is 4.", False),
    ]:
        taken = numbering.take(counting, HumanMessage(text), question=question)
        renumber(items, taken.renumber)
        items[msg_id] = counting.last_item
    assert items == {"task": 1, "e5": 5, "q": 5, "e6": 6}
    assert counting.head == "Entry" and counting.numbered
    later = numbering.take(counting, HumanMessage("Questions:\n1. What is c2?"), question=True)
    assert not later.new_item and counting.last_item == 6  # a question joins the entry before
