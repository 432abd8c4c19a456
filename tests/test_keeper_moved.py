"""A keeper's moved NOTES entries live in the archive, one row each: they come back when the turns
name them across a restart, across two keepers on one store, after a crash in the middle of a
cut, and from sessions stored as two JSON values; and the archive's lookup names exactly what a
scan of every moved entry named."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from keeper_middleware import Keeper, KeeperConfig, SQLiteArchive, create_keeper_agent
from keeper_middleware.archive.moved_rows import LEGACY_ENTRIES, LEGACY_KEYS, words_of
from keeper_middleware.archive.records import MovedUpdate
from keeper_middleware.messages.facts import text_of
from keeper_middleware.notes.block import Notes
from keeper_middleware.notes.recall import (
    ArchivedKeys,
    moved_update,
    named_in,
    parse_recall_block,
    track_moved,
)
from tests.fake_model import ScriptedChatModel
from tests.story_model import StoryModel, batch
from tests.test_keeper_crash import BoomError, archive_at, crashing_once  # noqa: F401

CONFIG = KeeperConfig(
    window=2048,
    reply_reserve=256,
    notes_every_items=2,
    notes_budget=("tokens", 128),
    tracked_names=r"\bc\d+\b",
)
THREAD = {"configurable": {"thread_id": "t1"}}


def agent_for(keeper: Keeper, saver, story: StoryModel | None = None):
    model = ScriptedChatModel(default=story or StoryModel())
    return create_keeper_agent(model, keeper=keeper, checkpointer=saver)


def feed(agent, items, text=lambda i: f"Today we set c{i} to {i * 3}.") -> None:
    for i in items:
        agent.invoke({"messages": [HumanMessage(batch(i, text(i)))]}, THREAD)


def start(keeper: Keeper, saver, count: int = 16):
    agent = agent_for(keeper, saver)
    agent.invoke({"messages": [HumanMessage("Task: read the items.")]}, THREAD)
    feed(agent, range(1, count + 1))
    return agent


def moved_now(keeper: Keeper) -> dict[str, str]:
    return {key: value for key, value in keeper.archive.moved_rows("t1") if value is not None}


def recalled_in(story: StoryModel, since: int) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for request in story.note_requests[since:]:
        found += parse_recall_block(text_of(request[-1]))
    return found


def change_one_moved(keeper: Keeper, saver, count: int, seed: int) -> tuple[str, int, StoryModel]:
    """A later turn changes an entry that left the NOTES; returns it, its old value, the model."""
    moved = moved_now(keeper)
    assert moved, "the budget moved nothing out"
    name = random.Random(seed).choice(sorted(moved))
    story = StoryModel()
    agent = agent_for(keeper, saver, story)
    feed(
        agent,
        (count + 1, count + 2),
        lambda i: f"Later we added 4 to {name}." if i == count + 1 else "Nothing else happened.",
    )
    return name, int(moved[name]), story


def assert_updated_in_place(keeper: Keeper, name: str, old: int, story: StoryModel) -> None:
    assert (name, str(old)) in recalled_in(story, 0)
    notes = keeper.notes("t1")
    assert notes.state_value(name) == str(old + 4)
    assert [key for key, _ in notes.state].count(name) == 1
    assert name not in moved_now(keeper)


@pytest.mark.parametrize("seed", [0, 1])
def test_moved_entries_come_back_after_a_restart(archive_at, seed):  # noqa: F811
    saver = InMemorySaver()
    first = Keeper(CONFIG, archive=archive_at())
    start(first, saver)
    first.close()
    reopened = Keeper(CONFIG, archive=archive_at())
    name, old, story = change_one_moved(reopened, saver, 16, seed)
    assert_updated_in_place(reopened, name, old, story)


def test_two_keepers_on_one_store_share_the_moved_entries(archive_at):  # noqa: F811
    saver = InMemorySaver()
    one, two = Keeper(CONFIG, archive=archive_at()), Keeper(CONFIG, archive=archive_at())
    start(one, saver, 12)
    agent = agent_for(two, saver)  # the other replica takes the session on
    feed(agent, range(13, 17))
    name, old, story = change_one_moved(one, saver, 16, 0)
    assert_updated_in_place(one, name, old, story)
    assert moved_now(two) == moved_now(one)
    assert moved_now(two)  # and the rest are still there, for both


def test_a_crash_inside_a_cut_that_moves_entries_loses_and_duplicates_none(archive_at):  # noqa: F811
    saver = InMemorySaver()
    keeper = Keeper(CONFIG, archive=archive_at())
    agent = start(keeper, saver, 12)
    before = moved_now(keeper)
    keeper.archive._before_commit = crashing_once(keeper.archive._before_commit)
    fed = 12
    with pytest.raises(BoomError):
        for fed in range(13, 19):  # the item that crashed is resumed below
            feed(agent, (fed,))
    assert moved_now(keeper) == before  # the cut and its moves are out together
    keeper.close()
    reopened = Keeper(CONFIG, archive=archive_at())
    agent = agent_for(reopened, saver)
    agent.invoke(None, THREAD)
    feed(agent, range(fed + 1, 19))
    moved = moved_now(reopened)
    held = reopened.notes("t1").state_dict()
    assert not set(moved) & set(held), "an entry is both in the NOTES and moved"
    for i in range(1, 19):  # every counter is in exactly one place, with its value
        key = f"c{i}"
        assert (key in moved) != (key in held)
        assert (moved.get(key) or held.get(key)) == str(i * 3)


def test_a_session_stored_with_the_old_values_goes_on_recalling(archive_at):  # noqa: F811
    saver = InMemorySaver()
    keeper = Keeper(CONFIG, archive=archive_at())
    start(keeper, saver)
    rows = list(keeper.archive.moved_rows("t1"))
    # as the previous version kept them: two JSON values, no rows
    keeper.archive.update_moved("t1", MovedUpdate(drop=tuple(key for key, _ in rows)))
    keeper.archive.put_value("t1", LEGACY_KEYS, [key for key, _ in rows])
    keeper.archive.put_value(
        "t1", LEGACY_ENTRIES, {key: value for key, value in rows if value is not None}
    )
    keeper.close()
    reopened = Keeper(CONFIG, archive=archive_at())
    name, old, story = change_one_moved(reopened, saver, 16, 0)
    assert_updated_in_place(reopened, name, old, story)
    assert reopened.archive.get_value("t1", LEGACY_ENTRIES) is None
    # the old rows stay, in their order, but the changed one; later cuts may move out more
    before = [key for key, _ in rows]
    after = [key for key, _ in reopened.archive.moved_rows("t1")]
    assert [key for key in after if key in before] == [key for key in before if key != name]


# -- the lookup names what a scan of every moved entry named ---------------------------------------
_LETTERS = st.sampled_from("abcXYZçÅßΣσλЖжあ漢字ｶ")
_WORDS = st.text(_LETTERS, min_size=1, max_size=4)
_KEYS = st.builds(
    lambda words, seps: (
        "".join(w + s for w, s in zip(words, seps, strict=False)).strip() or words[0]
    ),
    st.lists(_WORDS, min_size=1, max_size=3),
    st.lists(st.sampled_from([" ", "-", ": ", "  ", "_", "."]), min_size=3, max_size=3),
)


@settings(max_examples=150, deadline=None)
@given(
    keys=st.lists(_KEYS, min_size=1, max_size=25, unique=True),
    values=st.lists(st.integers(0, 999), min_size=25, max_size=25),
    picks=st.lists(st.integers(0, 24), max_size=6),
    noise=st.lists(_WORDS, max_size=8),
    upper=st.booleans(),
)
def test_the_archive_lookup_names_exactly_what_named_in_named(keys, values, picks, noise, upper):
    moved = {key: str(value) for key, value in zip(keys, values, strict=False)}
    text = " ".join([*(keys[i % len(keys)] for i in picks), *noise]) + "."
    if upper:
        text = text.upper()
    with SQLiteArchive(":memory:") as archive:
        archive.update_moved("s", MovedUpdate(add=tuple(moved.items())))
        candidates = dict(archive.moved_named("s", words_of(text)))
    assert named_in(candidates, text) == named_in(moved, text)


def test_rows_follow_what_the_two_values_tracked_over_many_cuts(tmp_path):
    """Cut after cut of random moves, recalls and unsets: the rows hold what ``track_moved``
    computed over the whole list (the order included)."""
    rng = random.Random(7)
    reference: dict[str, str] = {}
    with SQLiteArchive(tmp_path / "a.sqlite3") as archive:
        held: set[str] = set()
        for _ in range(60):
            pool = [f"k{n}" for n in range(40)] + ["Ada Fenn", "ada fenn", "Łódź"]
            back_in = set(rng.sample(sorted(reference), min(3, len(reference))))
            rest = sorted(set(reference) - back_in)
            unset = set(rng.sample(rest, min(2, len(rest))))
            before = set(held)
            held = (held | back_in) - unset
            out = [k for k in rng.sample(pool, 5) if k not in back_in]
            held -= set(out)
            moving = [(key, str(rng.randrange(100))) for key in out]
            notes = Notes(state=tuple((key, "1") for key in sorted(held)))
            reference = track_moved(reference, notes, moving, back=back_in | unset)
            change = moved_update(notes, moving, back=back_in | unset, held_before=before)
            archive.update_moved("s", change)
            rows = [(key, value) for key, value in archive.moved_rows("s") if value is not None]
            assert rows == list(reference.items())


def test_archived_keys_read_the_names_given_at_once_and_any_other_when_asked():
    asked: list[set[str]] = []
    stored = ["C1", "c1", "Ada Fenn", "Łódź"]

    def lookup(folded):
        asked.append(set(folded))
        return [key for key in stored if key.casefold() in folded]

    keys = ArchivedKeys(lookup, prefetch={"c1", "c2", "łódź"})
    assert "c1" in keys and "łódź" in keys and "c2" not in keys
    assert len(asked) == 1  # the names the text gives: one read
    assert "ada fenn" in keys and "nobody" not in keys  # others: read when a check asks
    assert len(asked) == 3
    fewer = keys.without({"C1"})
    assert "c1" in fewer  # "c1" is still moved
    assert "c1" not in keys.without({"C1", "c1"})
    assert "ada fenn" in fewer and len(asked) == 3  # nothing read again
