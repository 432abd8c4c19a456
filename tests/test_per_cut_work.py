"""The work a cut does over the whole NOTES is done once, or only for what changed, and gives
what doing it in full gives: the NOTES checked all at once reject exactly what the entry-by-entry
check rejects (with its message), fitting counts only the entries that leave and moves the same
ones, one pass applies and reports the changes, and the noted turns' words are read once."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keeper_middleware.archive.moved_rows import WORD, words_of
from keeper_middleware.notes.block import (
    ENTRY_PREFIX,
    STATE_SEPARATOR,
    Notes,
    _all_valid,
    _explain_invalid,
    render_notes,
)
from keeper_middleware.notes.budget import fit_notes
from keeper_middleware.notes.changes import (
    CloseLine,
    OpenLine,
    RuleLine,
    SetLine,
    UnsetLine,
    apply_and_report,
    apply_changes,
    unapplied,
)
from keeper_middleware.tokens.counting import estimate_tokens

# entries made of the pieces that make one invalid: blanks at either end, line breaks, " = ",
# nothing at all, repeats
_PIECES = [
    "a",
    "b",
    "domo07",
    " ",
    "\t",
    "\n",
    "\r",
    " = ",
    "=",
    "漢",
    "\x00",
    "\u2003",
    "\x1c",
    "\x85",
    "\u200b",
]
_TEXT = st.lists(st.sampled_from(_PIECES), max_size=4).map("".join)
_KEYS = st.one_of(st.sampled_from(["k1", "k2", "k 3"]), _TEXT)


def _entry_by_entry_error(notes: object) -> str | None:
    try:
        _explain_invalid(notes)  # type: ignore[arg-type]
    except ValueError as error:
        return str(error)
    return None


@settings(max_examples=400, deadline=None)
@given(
    rules=st.lists(_TEXT, max_size=3),
    open_entries=st.lists(_TEXT, max_size=3),
    state=st.lists(st.tuples(_KEYS, _TEXT), max_size=4),
)
def test_checking_all_entries_at_once_rejects_what_checking_each_rejects(
    rules: list[str], open_entries: list[str], state: list[tuple[str, str]]
) -> None:
    fields = SimpleNamespace(rules=tuple(rules), open=tuple(open_entries), state=tuple(state))
    expected = _entry_by_entry_error(fields)
    # the quick check may doubt a valid entry (one holding a NUL), never pass an invalid one
    if _all_valid(fields):  # type: ignore[arg-type]
        assert expected is None
    if expected is None:
        Notes(rules=tuple(rules), open=tuple(open_entries), state=tuple(state))
    else:
        with pytest.raises(ValueError) as raised:
            Notes(rules=tuple(rules), open=tuple(open_entries), state=tuple(state))
        assert str(raised.value) == expected


def test_an_entry_holding_a_nul_is_valid_like_any_other_text() -> None:
    notes = Notes(rules=("a\x00 b",), state=(("k\x00", "\x00 v"),), open=("x \x00",))
    assert notes.rules == ("a\x00 b",)


def test_an_entry_that_is_not_text_is_still_refused_by_name() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        Notes(rules=(None,))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty"):
        Notes(state=(("k", ""),))


# -- fitting the NOTES: only the entries that leave are counted -----------------------------------
def _fit_counting_every_entry(notes: Notes, budget: int, count_text) -> tuple:
    """Fitting as it was first written: every entry counted up front, then the same moves."""
    if count_text(render_notes(notes)) <= budget:
        return notes, (), ()
    state = dict(notes.state)
    order = notes.least_recent_keys()
    cost = {
        key: count_text(f"{ENTRY_PREFIX}{key}{STATE_SEPARATOR}{state[key]}") + 1 for key in order
    }
    open_cost = [count_text(ENTRY_PREFIX + entry) + 1 for entry in notes.open]
    total = count_text(render_notes(notes)) + 16
    moved_keys: list[str] = []
    moved_open = 0
    while True:
        for key in order[len(moved_keys) :]:
            if total <= budget:
                break
            moved_keys.append(key)
            total -= cost[key]
        while total > budget and moved_open < len(notes.open):
            total -= open_cost[moved_open]
            moved_open += 1
        gone = set(moved_keys)
        fitted = Notes(
            rules=notes.rules,
            state=tuple((k, v) for k, v in notes.state if k not in gone),
            open=notes.open[moved_open:],
            first_item=notes.first_item,
            last_item=notes.last_item,
            moved=notes.moved + len(moved_keys) + moved_open,
            recency=tuple(k for k in notes.recency if k not in gone),
        )
        size = count_text(render_notes(fitted))
        if size <= budget or (len(moved_keys) == len(order) and moved_open == len(notes.open)):
            break
        total = size + 1
    return fitted, tuple((k, state[k]) for k in moved_keys), notes.open[:moved_open]


def _random_notes(rng: random.Random, entries: int) -> Notes:
    keys = [f"{rng.choice(['domo', 'tele', 'badori', 'nudimi'])}{i:02d}" for i in range(entries)]
    state = tuple((key, str(rng.randint(-999, 9999))) for key in keys)
    recency = tuple(rng.sample(keys, k=rng.randint(0, len(keys))))
    opens = tuple(
        f"find out why {rng.choice(keys or ['x'])} changed {i}" for i in range(rng.randint(0, 6))
    )
    rules = tuple(
        f"Report {k} in words." for k in rng.sample(keys, k=min(len(keys), rng.randint(0, 3)))
    )
    return Notes(rules=rules, state=state, open=opens, first_item=1, last_item=9, recency=recency)


def _not_additive(text: str) -> int:
    """A counter that is not the sum of its lines (a whole text costs a little more)."""
    return estimate_tokens(text) + text.count("\n") // 3 + (len(text) > 500)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("counter", [estimate_tokens, _not_additive], ids=["estimate", "lumpy"])
def test_fitting_moves_the_same_entries_as_counting_every_entry(seed: int, counter) -> None:
    rng = random.Random(seed)
    notes = _random_notes(rng, rng.choice([0, 5, 40, 400]))
    whole = counter(render_notes(notes))
    for budget in (0, 10, whole // 2, whole - 1, whole, whole + 5):
        fitted = fit_notes(notes, budget=max(0, budget), count_text=counter)
        expected = _fit_counting_every_entry(notes, max(0, budget), counter)
        assert (fitted.notes, fitted.moved_state, fitted.moved_open) == expected
        assert fitted.notes.recency == expected[0].recency


def test_fitting_counts_only_the_entries_that_leave() -> None:
    notes = _random_notes(random.Random(7), 400)
    counted: list[str] = []

    def count(text: str) -> int:
        counted.append(text)
        return estimate_tokens(text)

    budget = count(render_notes(notes)) - 40
    counted.clear()
    fitted = fit_notes(notes, budget=budget, count_text=count)
    assert 0 < len(fitted.moved_state) < 40
    entry_counts = [text for text in counted if text.startswith(ENTRY_PREFIX)]
    assert len(entry_counts) == len(fitted.moved_state) + len(fitted.moved_open)


# -- applying changes: one pass gives both answers ------------------------------------------------
@pytest.mark.parametrize("seed", range(20))
def test_one_pass_applies_and_reports_what_two_passes_give(seed: int) -> None:
    rng = random.Random(seed)
    notes = _random_notes(rng, rng.choice([0, 3, 30]))
    keys = [key for key, _ in notes.state] + ["new1", "new2"]
    makers = [
        lambda: SetLine(rng.choice(keys), str(rng.randint(0, 99)), None),
        lambda: UnsetLine(rng.choice(keys)),
        lambda: OpenLine(f"check {rng.choice(keys)}"),
        lambda: CloseLine(rng.choice([*notes.open, "nothing like this", "find out"])),
        lambda: RuleLine(f"Report {rng.choice(keys)} in words."),
    ]
    changes = [rng.choice(makers)() for _ in range(rng.randint(0, 12))]
    applied, not_applied = apply_and_report(notes, changes)
    assert applied == apply_changes(notes, changes)
    assert applied.recency == apply_changes(notes, changes).recency
    assert not_applied == unapplied(notes, changes)


# -- the noted turns' words ----------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_the_words_of_a_text_are_its_case_folded_words_however_often_asked(text: str) -> None:
    expected = set(WORD.findall(text.casefold()))
    assert words_of(text) == expected
    assert words_of(str(text)) == expected  # asked again (remembered): the same answer
    assert isinstance(words_of(text), frozenset)  # shared answers cannot be changed by a caller


# -- the version a cut wrote is not parsed back by the next step ---------------------------------
@pytest.mark.parametrize("seed", range(3))
def test_the_notes_a_step_reads_are_the_stored_version_read_back(seed: int) -> None:
    """Every version the keeper remembers having written equals that version parsed from the
    archive, field for field (recency too) and type for type, while entries move and return."""
    from langchain_core.messages import HumanMessage
    from langgraph.checkpoint.memory import InMemorySaver

    from keeper_middleware import Keeper, KeeperConfig, create_keeper_agent
    from keeper_middleware.notes.block import notes_from_json
    from tests.fake_model import ScriptedChatModel
    from tests.story_model import StoryModel, batch

    rng = random.Random(seed)
    config = KeeperConfig(
        window=2048,
        reply_reserve=256,
        notes_every_items=2,
        notes_budget=("tokens", 128),
        tracked_names=r"\bc\d+\b",
    )
    keeper = Keeper(config)
    agent = create_keeper_agent(
        ScriptedChatModel(default=StoryModel()), keeper=keeper, checkpointer=InMemorySaver()
    )
    thread = {"configurable": {"thread_id": "t1"}}
    agent.invoke({"messages": [HumanMessage("Task: read the items.")]}, thread)
    versions = 0
    for item in range(1, 25):
        if item <= 16:
            text = f"Today we set c{item} to {item * 3 + seed}."
        else:  # a later turn changes an entry that may have left the NOTES
            text = f"Later we added 4 to c{rng.randint(1, 16)}."
        agent.invoke({"messages": [HumanMessage(batch(item, text))]}, thread)
        latest = keeper.archive.latest_notes("t1")
        if latest is None:
            continue
        versions += 1
        held = keeper.notes("t1")
        parsed = notes_from_json(latest.data_json)
        assert held == parsed
        assert held.recency == parsed.recency
        assert [type(pair) for pair in held.state] == [type(pair) for pair in parsed.state]
    assert versions > 5
    assert keeper.counters("t1").notes_entries_moved > 0
