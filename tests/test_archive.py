"""A cut archives its turns word for word, in order, exactly once: a cut key committed again
returns the first record and changes nothing, a turn already archived is skipped, the turn count
is the turns stored whatever mix of cuts made them, clashing or foreign turns are refused, a
reopened store continues seq and notes versions, and deleting a session removes only it."""

from __future__ import annotations

import random

import pytest

from keeper_middleware.archive.records import ArchivedTurn
from tests.archive_stores import (
    _fields,
    audit,
    make_turns,
    notes_for,
    open_store,
    spec_fixture,  # noqa: F401
    store_fixture,  # noqa: F401
)


def test_a_cut_archives_turns_word_for_word_in_order(store):
    turns = make_turns("s", 1, 4)
    record = store.commit_cut("s", cut_key="cut-1", turns=turns, notes=notes_for(1))
    assert record.turns_archived == 4
    assert record.notes_version == 1
    stored = list(store.turns("s"))
    assert [t.seq for t in stored] == [0, 1, 2, 3]
    assert [(t.msg_id, t.content, t.role) for t in stored] == [
        (t.msg_id, t.content, t.role) for t in turns
    ]
    assert store.turn_count("s") == 4
    assert store.latest_notes("s").text == "[NOTES] after cut 1"


def test_committing_a_cut_key_twice_returns_the_first_record_and_changes_nothing(store):
    first = store.commit_cut("s", cut_key="cut-1", turns=make_turns("s", 1), notes=notes_for(1))
    again = store.commit_cut("s", cut_key="cut-1", turns=make_turns("s", 2), notes=notes_for(2))
    assert again == first
    assert store.turn_count("s") == 3
    assert len(list(store.notes_versions("s"))) == 1


def test_a_turn_already_archived_is_skipped_never_duplicated(store):
    store.commit_cut("s", cut_key="cut-1", turns=make_turns("s", 1), notes=None)
    record = store.commit_cut(
        "s", cut_key="cut-2", turns=[*make_turns("s", 1), *make_turns("s", 2)], notes=None
    )
    assert record.turns_archived == 3
    assert store.turn_count("s") == 6
    assert store.archived_ids("s", ["c1-t0", "c2-t2", "never"]) == {"c1-t0", "c2-t2"}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_turn_count_is_the_turns_stored_whatever_mix_of_cuts_made_them(store, seed):
    rng = random.Random(seed)
    for cut in range(1, 13):  # new turns, turns archived before, a cut key committed again
        turns = make_turns("s", cut, rng.randint(0, 5))
        if cut > 1 and rng.random() < 0.5:
            turns = [*make_turns("s", rng.randint(1, cut - 1), 2), *turns]
        key = f"cut-{rng.randint(1, cut)}"
        store.commit_cut("s", cut_key=key, turns=turns, notes=None)
        assert store.turn_count("s") == len(list(store.turns("s")))
    store.delete_session("s")
    assert store.turn_count("s") == 0
    store.commit_cut("s", cut_key="again", turns=make_turns("s", 99, 2), notes=None)
    assert store.turn_count("s") == 2 == len(list(store.turns("s")))


def test_two_different_turns_under_one_id_in_a_cut_are_refused(store):
    a, b = make_turns("s", 1, 1), make_turns("s", 2, 1)
    clash = [a[0], ArchivedTurn(**{**_fields(b[0]), "msg_id": a[0].msg_id})]
    with pytest.raises(ValueError, match="share msg_id"):
        store.commit_cut("s", cut_key="cut-1", turns=clash, notes=None)
    assert store.commit_cut("s", cut_key="cut-1", turns=a + a, notes=None).turns_archived == 1


def test_a_turn_of_another_session_is_refused(store):
    with pytest.raises(ValueError, match="session 'other'"):
        store.commit_cut("s", cut_key="k", turns=make_turns("other", 1), notes=None)


def test_reopening_continues_seq_and_notes_versions(spec):
    with open_store(spec) as first:
        first.commit_cut("s", cut_key="cut-1", turns=make_turns("s", 1), notes=notes_for(1))
    with open_store(spec) as second:
        record = second.commit_cut(
            "s", cut_key="cut-2", turns=make_turns("s", 2), notes=notes_for(2)
        )
        assert record.notes_version == 2
        assert [t.seq for t in second.turns("s")] == list(range(6))
        assert second.find_cut("s", "cut-1").turns_archived == 3
        audit(second, "s")


def test_delete_session_removes_only_that_session(store):
    for session in ("a", "b"):
        store.commit_cut(session, cut_key="cut-1", turns=make_turns(session, 1), notes=notes_for(1))
        store.put_value(session, "k", 1)
    assert store.sessions() == ["a", "b"]
    store.delete_session("a")
    assert store.sessions() == ["b"]
    assert (store.turn_count("a"), store.latest_notes("a"), store.get_value("a", "k")) == (
        0,
        None,
        None,
    )
    assert store.find_cut("a", "cut-1") is None
    assert store.turn_count("b") == 3
    store.commit_cut("a", cut_key="cut-1", turns=make_turns("a", 1), notes=notes_for(1))
    assert [t.seq for t in store.turns("a")] == [0, 1, 2]


def test_values_saved_after_another_opening_erased_the_session_are_kept(spec):
    """A store that saved a session's values before saves them again after another opening of
    the same archive erased the session: nothing is refused, nothing lost."""
    with open_store(spec) as first, open_store(spec) as second:
        first.put_values("a", {"k": 1, "j": [1, 2]})
        second.delete_session("a")
        assert first.get_value("a", "k") is None
        first.put_values("a", {"k": 2})
        first.put_values("a", {"j": None, "i": {"x": 3}})
        assert [second.get_value("a", key) for key in ("k", "j", "i")] == [2, None, {"x": 3}]
        assert second.sessions() == ["a"]


def test_archived_ids_answers_for_many_ids_at_once(store):
    turns = [
        ArchivedTurn(session="s", msg_id=f"m{i}", item=1, role="human", content="x")
        for i in range(1_200)
    ]
    store.commit_cut("s", cut_key="k", turns=turns, notes=None)
    asked = [f"m{i}" for i in range(0, 2_400, 2)]
    assert store.archived_ids("s", asked) == {f"m{i}" for i in range(0, 1_200, 2)}
