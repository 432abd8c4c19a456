"""What keeps a long conversation's cost per call flat: the NOTES count toward the item cadence,
and an entry that left the NOTES comes back into view when the turns being noted name it, so it
is updated in place rather than skipped, left stale in the archive or added twice."""

from __future__ import annotations

import itertools
import random

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from keeper_middleware import Keeper, KeeperConfig, create_keeper_agent
from keeper_middleware.messages.facts import keeper_kind, text_of
from keeper_middleware.notes.block import Notes, render_notes
from keeper_middleware.notes.cadence import items_due
from keeper_middleware.notes.recall import (
    RECALL_HEADER,
    named_in,
    parse_recall_block,
    recall_block,
    settle_recalled,
    track_moved,
    with_recalled,
)
from keeper_middleware.tokens.counting import resolve_token_counter
from tests.fake_model import ScriptedChatModel
from tests.story_model import StoryModel, batch

THREAD = {"configurable": {"thread_id": "t1"}}
NOTES_BUDGET = 128


# -- the cadence ---------------------------------------------------------------------------------
@pytest.mark.parametrize("every", [1, 2, 6, 10, 25])
def test_without_notes_the_cadence_is_every_n_items(every):
    assert items_due(every=every, notes_tokens=0, new_tokens=5000, new_items=3) == every
    assert items_due(every=every, notes_tokens=800, new_tokens=0, new_items=0) == every


@pytest.mark.parametrize("seed", range(5))
def test_bigger_notes_call_for_notes_sooner_but_never_under_half_the_cadence(seed):
    rng = random.Random(seed)
    every = rng.randrange(2, 30)
    per_item = rng.randrange(50, 3000)
    items = rng.randrange(1, every + 1)
    due = [
        items_due(every=every, notes_tokens=n, new_tokens=per_item * items, new_items=items)
        for n in range(0, 20 * per_item, max(1, per_item // 7))
    ]
    assert due[0] == every
    assert all(a >= b for a, b in itertools.pairwise(due))  # never later as NOTES grow
    assert min(due) == max(1, -(-every // 2))


@pytest.mark.parametrize("seed", range(6))
def test_the_notes_growth_is_shared_between_the_calls_size_and_how_often_they_are_resent(seed):
    """The average call (NOTES plus half a cycle of new items) grows by about half the NOTES'
    growth, not by none of it (every cut would resend them sooner) nor all of it."""
    rng = random.Random(seed)
    every = rng.randrange(8, 40)
    per_item = rng.randrange(200, 3000)
    items = rng.randrange(1, every + 1)
    for _ in range(20):
        notes = rng.randrange(per_item, per_item * (every // 2))  # short of the floor
        due = items_due(
            every=every, notes_tokens=notes, new_tokens=per_item * items, new_items=items
        )
        average_call_growth = notes + per_item * (due - every) / 2
        assert notes / 2 - per_item / 2 <= average_call_growth <= notes / 2 + per_item / 2
        assert due < every  # the NOTES are still noted sooner as they fill


def test_the_cadence_refuses_sizes_that_cannot_be():
    with pytest.raises(ValueError, match="every must be >= 1"):
        items_due(every=0, notes_tokens=0, new_tokens=0, new_items=0)
    with pytest.raises(ValueError, match="never negative"):
        items_due(every=5, notes_tokens=-1, new_tokens=0, new_items=0)


def _cut_items(keeper: Keeper) -> list[int]:
    """The last item each NOTES version accounts for, oldest first."""
    return [v.last_item for v in keeper.archive.notes_versions("t1") if v.last_item is not None]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("every", [6, 10])
def test_as_the_notes_fill_they_are_taken_sooner_and_never_under_half_the_cadence(seed, every):
    rng = random.Random(seed)
    keeper = Keeper(KeeperConfig(window=32_768, notes_every_items=every))
    agent = create_keeper_agent(
        ScriptedChatModel(default=StoryModel()), keeper=keeper, checkpointer=InMemorySaver()
    )
    agent.invoke({"messages": [HumanMessage("Task: read the items.")]}, THREAD)
    names = iter(f"k{n}" for n in range(10_000))
    for i in range(1, 8 * every + 1):
        sets = " ".join(
            f"Today we set {next(names)} to {rng.randrange(1, 999)}." for _ in range(12)
        )
        agent.invoke({"messages": [HumanMessage(batch(i, sets, filler=8))]}, THREAD)
    cuts = _cut_items(keeper)
    gaps = [b - a for a, b in itertools.pairwise(cuts)]
    assert cuts[0] == every  # empty NOTES: the plain cadence
    assert gaps and min(gaps) >= -(-every // 2)
    assert gaps[-1] < every  # big NOTES: sooner
    notes = keeper.notes("t1")
    # every counter noted once: in the NOTES or, over their budget, moved to the archive
    assert len(notes.state) + notes.moved == 12 * cuts[-1]


# -- recalling moved entries: the pure parts -----------------------------------------------------
def test_only_whole_word_mentions_recall_an_entry():
    moved = {"c1": "3", "c12": "36", "red box": "4"}
    assert named_in(moved, "Later we added 4 to c1.") == ["c1"]
    assert named_in(moved, "c12 went up; the red box too.") == ["c12", "red box"]
    assert named_in(moved, "c123 and a box that is red") == []


@pytest.mark.parametrize("room", [0, 10, 40, 400])
def test_the_recall_block_stays_within_its_room_and_reads_back(room):
    count = resolve_token_counter(None).count_text
    entries = [(f"c{n}", str(n * 3)) for n in range(30)]
    block, held = recall_block(entries, room=room, count_text=count)
    assert count(block) <= room
    assert parse_recall_block(f"[NOTES REQUEST] ...\n{block}") == held
    assert list(held) == entries[: len(held)]
    if held:
        assert block.startswith(RECALL_HEADER)


def test_a_recalled_entry_the_reply_sets_stays_and_one_it_leaves_goes_back():
    notes = Notes(state=(("a", "1"),), recency=("a",))
    recalled = (("c1", "3"), ("c2", "6"))
    shown = with_recalled(notes, recalled)
    assert shown.state_dict() == {"a": "1", "c1": "3", "c2": "6"}
    assert shown.least_recent_keys()[:2] == ["c1", "c2"]
    after = Notes(state=(("a", "1"), ("c1", "7"), ("c2", "6")), recency=("c2", "a", "c1"))
    settled = settle_recalled(notes, after, recalled, touched={"c1"})
    assert settled.state_dict() == {"a": "1", "c1": "7"}
    moved = track_moved({"c1": "3", "c2": "6", "c9": "1"}, settled, [("a", "1")], back={"c1"})
    assert moved == {"c2": "6", "c9": "1", "a": "1"}


# -- recalling moved entries: a whole conversation ------------------------------------------------
def _moved_out_conversation(window: int, count: int) -> tuple[Keeper, StoryModel, object]:
    keeper = Keeper(
        KeeperConfig(
            window=window,
            reply_reserve=256,
            notes_every_items=2,
            notes_budget=("tokens", NOTES_BUDGET),
            tracked_names=r"\bc\d+\b",
        )
    )
    story = StoryModel()
    agent = create_keeper_agent(
        ScriptedChatModel(default=story), keeper=keeper, checkpointer=InMemorySaver()
    )
    agent.invoke({"messages": [HumanMessage("Task: read the items.")]}, THREAD)
    for i in range(1, count + 1):
        agent.invoke(
            {"messages": [HumanMessage(batch(i, f"Today we set c{i} to {i * 3}."))]}, THREAD
        )
    return keeper, story, agent


def _overflow_texts(keeper: Keeper) -> list[str]:
    return [t.content for t in keeper.archive.turns("t1") if t.name == "notes_overflow"]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("window", "count"), [(2048, 16), (4096, 24)])
def test_a_moved_entry_the_turns_change_comes_back_and_is_updated_in_place(seed, window, count):
    keeper, story, agent = _moved_out_conversation(window, count)
    held = keeper.notes("t1").state_dict()
    gone = [f"c{i}" for i in range(1, count + 1) if f"c{i}" not in held]
    assert gone, "the budget moved nothing out"
    name = random.Random(seed).choice(gone)
    old = int(name[1:]) * 3
    asked_before = len(story.note_requests)
    reasks = keeper.counters("t1").reasks
    for i in (count + 1, count + 2):
        text = f"Later we added 4 to {name}." if i == count + 1 else "Nothing else happened."
        agent.invoke({"messages": [HumanMessage(batch(i, text))]}, THREAD)
    recalling = [
        text_of(request[-1])
        for request in story.note_requests[asked_before:]
        if parse_recall_block(text_of(request[-1]))
    ]
    assert recalling and f"- {name} = {old}" in recalling[0].splitlines()
    notes = keeper.notes("t1")
    assert notes.state_value(name) == str(old + 4)  # worked out from the recalled value
    assert [key for key, _ in notes.state].count(name) == 1
    assert keeper.counters("t1").reasks == reasks
    # nothing lost: the value it had when it moved out is still in the archive, word for word
    assert any(f"- {name} = {old}" in text.splitlines() for text in _overflow_texts(keeper))
    assert name not in dict(keeper.archive.moved_rows("t1"))
    assert keeper.tokens.count_text(render_notes(notes)) <= NOTES_BUDGET


@pytest.mark.parametrize("window", [2048, 4096])
def test_a_moved_entry_only_named_stays_in_the_archive_as_it_was(window):
    keeper, story, agent = _moved_out_conversation(window, 16)
    held = keeper.notes("t1").state_dict()
    name = next(f"c{i}" for i in range(1, 17) if f"c{i}" not in held)
    asked_before = len(story.note_requests)
    for i in (17, 18):
        agent.invoke({"messages": [HumanMessage(batch(i, f"We looked at {name} again."))]}, THREAD)
    assert any(
        parse_recall_block(text_of(request[-1])) for request in story.note_requests[asked_before:]
    )
    assert name not in keeper.notes("t1").state_dict()
    moved = dict(keeper.archive.moved_rows("t1"))
    assert moved[name] == str(int(name[1:]) * 3)
    assert name in keeper.search("t1", name)


def test_every_notes_request_with_a_recall_fits_the_window():
    keeper, story, agent = _moved_out_conversation(2048, 16)
    for i in range(17, 40):
        names = " ".join(f"Later we added 1 to c{n}." for n in range(1, 16))
        agent.invoke({"messages": [HumanMessage(batch(i, names, filler=2))]}, THREAD)
    requests = [r for r in story.note_requests if parse_recall_block(text_of(r[-1]))]
    assert requests
    for request in requests:
        assert keeper.tokens.count_messages(request) <= keeper.config.budget
        assert keeper_kind(request[-1]) == "notes_request"
