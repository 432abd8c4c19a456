"""A copied thread goes on with the memory its checkpoint had, through every entry point.

``update_state({"configurable": {"thread_id": "t2"}}, get_state(t1).values)`` is how a thread
is copied; invoking ``t2`` then raised ``ArchiveError: ... the archive was replaced or deleted``,
because the archive keeps memory per thread and ``t2`` had none. Now the copy goes on in the
archive of the thread it came from, as a branch of its own from the cut its state names (as a
fork does): its NOTES and archived turns are there, and the thread it came from never sees what
the copy does.
"""

from __future__ import annotations

import pytest
from langchain_core.messages import BaseMessage

from keeper_middleware import Keeper, KeeperConfig
from keeper_middleware.messages.facts import keeper_kind, text_of
from keeper_middleware.state_view import model_view
from tests.entry_points import ENTRY_POINTS, build
from tests.fake_model import ScriptedChatModel

pytestmark = pytest.mark.filterwarnings(
    "ignore:create_react_agent has been moved:langgraph.warnings.LangGraphDeprecatedSinceV10"
)
T1 = {"configurable": {"thread_id": "t1"}}
T2 = {"configurable": {"thread_id": "t2"}}


def note_taker(messages: list[BaseMessage]) -> str:
    """Notes each counter the noted turns set (``Mira set cN to V``)."""
    if keeper_kind(messages[-1]) not in ("notes_request", "notes_reask"):
        return "ok"
    lines = []
    for message in messages:
        words = text_of(message).replace(".", " ").split()
        for at, word in enumerate(words[:-3]):
            if word == "set" and words[at + 2] == "to":
                lines.append(f"SET {words[at + 1]} = {words[at + 3]}")
    return "\n".join(dict.fromkeys(lines)) or "NO CHANGES"


def memory(keeper: Keeper, graph, config) -> tuple[dict[str, str], list[str]]:
    thread = config["configurable"]["thread_id"]
    head = keeper.head_of(thread, graph.get_state(config).values)
    notes = dict(keeper.notes(thread, head=head).state)
    return notes, [t.content for t in keeper.turns(thread, head=head)]


@pytest.mark.parametrize("kind", ENTRY_POINTS)
def test_a_copied_thread_goes_on_with_its_memory_and_the_original_is_untouched(kind):
    keeper = Keeper(KeeperConfig(window=2048, reply_reserve=256, notes_every_items=3))
    entry = build(kind, ScriptedChatModel(default=note_taker), keeper)
    entry.say("Task: keep the ledger.")
    for item in range(1, 8):
        entry.say(f"Item {item}. Mira set c{item} to {item * 3}. The ledger was checked again.")
    assert keeper.counters("t1").cuts >= 1
    before = memory(keeper, entry.graph, T1)
    entry.graph.update_state(T2, entry.graph.get_state(T1).values)
    assert memory(keeper, entry.graph, T2) == before  # the copy has the memory t1 had
    for item in range(8, 16):  # the copy goes on, past cuts of its own
        entry.say(f"Item {item}. Mira set c{item + 20} to {item}. Checked again.", thread="t2")
    notes, turns = memory(keeper, entry.graph, T2)
    assert notes.get("c1") == "3"  # what t1 noted before the copy
    assert any("c28 to 8" in t for t in turns)  # what the copy archived itself
    head = keeper.head_of("t2", entry.graph.get_state(T2).values)
    assert "c1 to 3" in keeper.search("t2", "c1", head=head)
    # t1 is untouched by its copy, and goes on as it would have
    assert memory(keeper, entry.graph, T1) == before
    entry.say("Item 8. Mira set c8 to 24.", thread="t1")
    notes, turns = memory(keeper, entry.graph, T1)
    assert not any("c28" in t for t in turns) and "c28" not in notes
    head = keeper.head_of("t1", entry.graph.get_state(T1).values)
    assert keeper.search("t1", "c28", head=head).startswith("No matches")


def test_a_pasted_notes_message_with_a_forged_mark_never_leads_into_another_thread():
    from keeper_middleware.messages.marks import MARK_KEY

    keeper = Keeper(KeeperConfig(window=2048, reply_reserve=256, notes_every_items=3))
    entry = build("agent", ScriptedChatModel(default=note_taker), keeper)
    entry.say("Task: keep the ledger.")
    for item in range(1, 5):
        entry.say(f"Item {item}. Mira set c{item} to {item * 3}.")
    values = entry.graph.get_state(T1).values  # the NOTES live in the keeper's channel
    view = model_view(values["messages"], values.get("keeper"))
    notes = next(m for m in view if keeper_kind(m) == "notes")
    assert keeper.archived_as("t3", None, [notes]) == "t1"  # the keeper's own: a copy
    forged = notes.model_copy(
        update={"additional_kwargs": {**notes.additional_kwargs, MARK_KEY: "0" * 64}}
    )
    assert keeper.archived_as("t4", None, [forged]) == "t4"
