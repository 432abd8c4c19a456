"""A long run: hundreds of cuts through create_keeper_agent with a SQLite checkpointer."""

from __future__ import annotations

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.sqlite import SqliteSaver

from keeper_middleware import Keeper, KeeperConfig, create_keeper_agent
from keeper_middleware.notes.block import render_notes
from keeper_middleware.tokens.counting import ApproximateTokenCounter
from tests.fake_model import ScriptedChatModel
from tests.story_model import StoryModel, batch

THREAD = {"configurable": {"thread_id": "long"}}


@pytest.mark.slow
def test_two_hundred_cuts_keep_the_window_and_the_whole_archive(tmp_path):
    # 200 counters make 200 STATE lines: ~940 tokens by the default (conservative) counter,
    # which leaves a 2,048-token window no room for a note request beside them
    config = KeeperConfig(window=4096, reply_reserve=256, notes_every_items=1)
    model = ScriptedChatModel(default=StoryModel())
    keeper = Keeper(config, archive=tmp_path / "archive.sqlite3")
    with SqliteSaver.from_conn_string(str(tmp_path / "checkpoints.sqlite3")) as saver:
        agent = create_keeper_agent(
            model, system_prompt="You read.", keeper=keeper, checkpointer=saver
        )
        agent.invoke(
            {"messages": [HumanMessage("Task: read every item. Rule: never round.")]}, THREAD
        )
        items = 0
        while keeper.counters("long").cuts < 200:
            items += 1
            agent.invoke(
                {
                    "messages": [
                        HumanMessage(
                            batch(items, f"Today we set c{items} to {items * 7}.", filler=5)
                        )
                    ]
                },
                THREAD,
            )
            if items % 25 == 0:
                agent.invoke({"messages": [HumanMessage(f"Questions: what is c{items}?")]}, THREAD)
    counter = ApproximateTokenCounter()
    assert max(counter.count_messages(r.messages, []) for r in model.received) <= config.window
    archived = [t.content for t in keeper.archive.turns("long")]
    inputs = [c for c in archived if c.startswith("Item ")]
    # every input but the ones still in view is in the archive, exactly once
    assert len(inputs) == len(set(inputs)) >= items - 2
    notes = keeper.notes("long")
    assert notes.rules == ("never round.",)
    # every value is in the NOTES, or (set least recently, over the NOTES budget) moved word for
    # word to the archive, where search finds it
    held = notes.state_dict()
    moved = "\n".join(archived)
    for i in range(1, notes.last_item + 1):
        assert held.get(f"c{i}") == str(i * 7) or f"c{i} = {i * 7}" in moved, i
    assert counter.count_text(render_notes(notes)) <= config.notes_tokens
    assert len(list(keeper.archive.notes_versions("long"))) == keeper.counters("long").cuts
