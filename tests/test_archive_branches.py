"""The archive as a tree of cuts over immutable records: a branch sees its own cuts and records
and nothing of a sibling's, a record another branch archived first is linked instead of copied, a
message edited under its id is a new record beside the old one, moved entries follow the branch,
and a session that never forked answers as one line (SQLite and, postgres tier, PostgreSQL)."""

from __future__ import annotations

import pytest

from keeper_middleware.archive.records import TIP, ArchivedTurn, MovedUpdate
from keeper_middleware.archive.store import UnknownCutError
from tests.archive_stores import (
    make_turns,
    notes_for,
    open_store,
    spec_fixture,  # noqa: F401
    store_fixture,  # noqa: F401
)


def turn(msg_id: str, content: str, item: int = 1) -> ArchivedTurn:
    return ArchivedTurn(session="s", msg_id=msg_id, item=item, role="human", content=content)


def texts(store, head) -> list[str]:
    return [t.content for t in store.turns("s", within=store.chain("s", head))]


def test_a_session_that_never_forked_is_one_line_and_sees_everything(store):
    store.commit_cut("s", cut_key="a", turns=make_turns("s", 1), notes=notes_for(1))
    store.commit_cut("s", cut_key="b", turns=make_turns("s", 2), notes=notes_for(2))
    tip = store.chain("s", TIP)
    assert (tip.head, tip.whole) == ("b", True)
    assert store.chain("s", "b").whole
    assert [c.parent for c in store.cuts("s")] == [None, "a"]
    assert [c.ordinal for c in store.cuts("s")] == [1, 2]
    # the branch as it was at "a": the first cut's records and NOTES only
    before = store.chain("s", "a")
    assert not before.whole
    assert texts(store, "a") == [t.content for t in make_turns("s", 1)]
    assert store.notes_at("s", "a").text == "[NOTES] after cut 1"
    assert store.notes_at("s", "b").text == "[NOTES] after cut 2"
    assert store.notes_at("s", None) is None
    assert list(store.turns("s", within=store.chain("s", None))) == []


def test_a_fork_sees_its_own_records_and_notes_and_never_a_siblings(store):
    store.commit_cut("s", cut_key="root", turns=[turn("m1", "shared start")], notes=notes_for(1))
    store.commit_cut(
        "s", cut_key="left", turns=[turn("m2", "left only", 2)], notes=notes_for(2), parent="root"
    )
    store.commit_cut(
        "s", cut_key="right", turns=[turn("m3", "right only", 2)], notes=notes_for(3), parent="root"
    )
    assert texts(store, "left") == ["shared start", "left only"]
    assert texts(store, "right") == ["shared start", "right only"]
    assert store.notes_at("s", "left").text == "[NOTES] after cut 2"
    assert store.notes_at("s", "right").text == "[NOTES] after cut 3"
    assert store.chain("s", TIP).head == "right"
    assert not store.chain("s", "right").whole  # the session forked: no branch is all of it
    # every NOTES version of every branch is kept, in the order they were written
    assert [v.cut_key for v in store.notes_versions("s")] == ["root", "left", "right"]


def test_a_record_another_branch_archived_first_is_linked_not_copied(store):
    store.commit_cut("s", cut_key="root", turns=[turn("m1", "start")], notes=None)
    shared = [turn("m2", "said before the fork", 2), turn("m3", "also before", 2)]
    store.commit_cut("s", cut_key="left", turns=[*shared, turn("m4", "left", 3)], notes=None)
    count = store.turn_count("s")
    record = store.commit_cut(
        "s", cut_key="right", turns=[*shared, turn("m5", "right", 3)], notes=None, parent="root"
    )
    assert record.turns_archived == 1  # only "right" is new; the two shared turns are linked
    assert store.turn_count("s") == count + 1
    assert texts(store, "right") == ["start", "said before the fork", "also before", "right"]
    assert texts(store, "left") == ["start", "said before the fork", "also before", "left"]


def test_an_edited_message_is_a_new_record_beside_the_old_one(store):
    store.commit_cut("s", cut_key="one", turns=[turn("m1", "the first text")], notes=None)
    record = store.commit_cut("s", cut_key="two", turns=[turn("m1", "the edited text")], notes=None)
    assert record.turns_archived == 1  # same id, new content: kept, not skipped
    assert [t.content for t in store.turns("s")] == ["the first text", "the edited text"]
    assert store.turn("s", "m1").content == "the edited text"  # the latest record of the id
    assert store.turn("s", "m1", within=store.chain("s", "one")).content == "the first text"
    # the same content again under the id is the same record: never archived twice
    again = store.commit_cut(
        "s", cut_key="three", turns=[turn("m1", "the edited text")], notes=None
    )
    assert again.turns_archived == 0


def test_notes_and_moved_entries_follow_the_branch(store):
    store.commit_cut(
        "s", cut_key="root", turns=[], notes=notes_for(1), moved=MovedUpdate(add=(("a", "1"),))
    )
    store.commit_cut(
        "s",
        cut_key="left",
        turns=[],
        notes=notes_for(2),
        moved=MovedUpdate(drop=("a",), add=(("b", "2"),)),
    )
    store.commit_cut(
        "s",
        cut_key="right",
        turns=[],
        notes=None,
        moved=MovedUpdate(add=(("c", "3"),)),
        parent="root",
    )
    left, right = store.chain("s", "left"), store.chain("s", "right")
    assert list(store.moved_rows("s", within=left)) == [("b", "2")]
    assert list(store.moved_rows("s", within=right)) == [("a", "1"), ("c", "3")]
    assert store.moved_named("s", {"a", "b", "c"}, within=right) == [("a", "1"), ("c", "3")]
    assert store.moved_among("s", {"b"}, within=right) == []
    # a cut without NOTES of its own has its parent's
    assert store.notes_at("s", "right").text == "[NOTES] after cut 1"


def test_notes_read_at_every_step_stay_each_branchs_own_as_other_branches_cut(store):
    """Every step reads the NOTES at its head (SQLite remembers what it read): reading them
    again after a sibling branch cut, or after the session's latest cut moved, gives the
    branch's own NOTES, never another branch's."""
    store.commit_cut("s", cut_key="root", turns=[], notes=notes_for(1))
    store.commit_cut("s", cut_key="left", turns=[], notes=notes_for(2), parent="root")
    assert store.notes_at("s", "left").text == "[NOTES] after cut 2"
    assert store.latest_notes("s").text == "[NOTES] after cut 2"
    store.commit_cut("s", cut_key="right", turns=[], notes=notes_for(3), parent="root")
    assert store.notes_at("s", "left").text == "[NOTES] after cut 2"
    assert store.notes_at("s", "right").text == "[NOTES] after cut 3"
    assert store.latest_notes("s").text == "[NOTES] after cut 3"
    assert store.notes_at("s", "root").text == "[NOTES] after cut 1"
    # the left branch goes on with a cut of no NOTES of its own: it keeps its own, not the
    # session's latest (the right branch's)
    store.commit_cut("s", cut_key="left-2", turns=[], notes=None, parent="left")
    assert store.notes_at("s", "left-2").text == "[NOTES] after cut 2"
    assert store.latest_notes("s").text == "[NOTES] after cut 2"
    assert store.notes_at("s", "right").text == "[NOTES] after cut 3"
    # an erased session forgets what was read of it
    store.delete_session("s")
    store.commit_cut("s", cut_key="left", turns=[], notes=notes_for(4))
    assert store.notes_at("s", "left").text == "[NOTES] after cut 4"
    assert store.latest_notes("s").text == "[NOTES] after cut 4"


def test_a_cut_after_an_unknown_cut_is_refused_with_the_fix(store):
    with pytest.raises(UnknownCutError, match="has no cut 'nowhere'"):
        store.commit_cut("s", cut_key="k", turns=[], notes=None, parent="nowhere")
    store.commit_cut("s", cut_key="k", turns=[], notes=None)
    with pytest.raises(UnknownCutError, match="start a new thread"):
        store.chain("s", "nowhere")


def test_a_forked_tree_survives_reopening(spec):
    with open_store(spec) as first:
        first.commit_cut("s", cut_key="root", turns=[turn("m1", "start")], notes=notes_for(1))
        first.commit_cut("s", cut_key="left", turns=[turn("m2", "left", 2)], notes=None)
        first.commit_cut(
            "s", cut_key="right", turns=[turn("m3", "right", 2)], notes=None, parent="root"
        )
    with open_store(spec) as second:
        assert texts(second, "left") == ["start", "left"]
        assert texts(second, "right") == ["start", "right"]
        grown = second.commit_cut("s", cut_key="right-2", turns=[turn("m4", "more", 3)], notes=None)
        assert grown.parent == "right" and grown.ordinal == 4
        assert texts(second, "right-2") == ["start", "right", "more"]


def test_positions_are_kept_per_record(store):
    store.commit_cut("s", cut_key="a", turns=make_turns("s", 1), notes=None)
    store.set_positions("s", [(0, 0), (1, 4), (2, 4)])
    assert store.positions("s", [0, 1, 2, 99]) == {0: 0, 1: 4, 2: 4}


def test_a_branch_reads_its_records_in_the_order_it_archived_them(store):
    """A branch that takes up records another branch archived first (a fork after an edit in
    the middle) reads them where they stand in its own history, not in storage order."""
    store.commit_cut("s", cut_key="root", turns=[turn("task", "the task")], notes=None)
    shared = [turn("m1", "the first text"), turn("r1", "a reply")]
    store.commit_cut(
        "s", cut_key="edited", turns=[turn("m1", "the edited text"), shared[1]], notes=None
    )
    store.commit_cut("s", cut_key="plain", turns=shared, notes=None, parent="root")
    assert texts(store, "plain") == ["the task", "the first text", "a reply"]
    assert texts(store, "edited") == ["the task", "the edited text", "a reply"]
    chain = store.chain("s", "plain")
    assert [chain.rank(t.seq) for t in store.turns("s", within=chain)] == [0, 1, 2]
    assert store.turn("s", "m1", within=chain).content == "the first text"
