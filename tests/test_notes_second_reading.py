"""A noted value must follow what the turns say about its key, and a second reading replaces
only the lines the checks question.

Each reading of a batch can misread a statement: take the amount the next sentence takes from
another counter, skim past a change, read the value the NOTES hold with the wrong sign. Such a
line passes the checks that ask only whether an amount is in the turns, enters the NOTES and is
replayed by every later answer. The keeper has the turns word for word, so it compares each
line with the amounts they state about its key, and asks again; the lines that passed stay as
first read, since the second reading misreads something of its own.
"""

from __future__ import annotations

from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver

from keeper_middleware import Keeper, KeeperConfig, create_keeper_agent
from keeper_middleware.messages.facts import keeper_kind, text_of
from keeper_middleware.notes.block import Notes
from keeper_middleware.notes.checks import WorkingFollowsText, stated_about
from keeper_middleware.notes.taking import NoteOutcome, NoteTaking
from keeper_middleware.testing import ScriptedChatModel
from tests.test_note_taking import run as drive

HELD = Notes(state=(("domo86", "357"), ("kilo12", "100")))
TEXT = "Mira Lowe took 25 from domo86. Oona Wren took 40 from kilo12."


def run(text: str, notes: Notes, replies: list[str]) -> tuple[NoteOutcome, list[str | None]]:
    return drive(NoteTaking(notes=notes, noted_text=text), replies)


def test_the_amounts_stated_about_a_key_include_the_sentences_that_go_on_speaking_of_it():
    text = (
        "Attention turned to nubese23. Thea Holt removed three from it. Oona Wren took 13 "
        "from it. The mill smelled of tar. Celia Brandt added 7 to kilo12."
    )
    stated = stated_about(text, frozenset({"nubese23", "kilo12"}))
    assert stated["nubese23"].amounts == (3.0, 13.0)
    assert stated["kilo12"].amounts == (7.0,)


def test_an_amount_the_turns_state_about_another_key_is_questioned_and_read_again():
    first = "SET domo86 = 317 (= 357 - 40)\nSET kilo12 = 60 (= 100 - 40)"
    again = "SET domo86 = 332 (= 357 - 25)\nSET kilo12 = 60 (= 100 - 40)"
    outcome, sent = run(TEXT, HELD, [first, again])
    assert sent[1] is not None and "40 is not stated about domo86" in sent[1]
    assert outcome.notes.state_dict() == {"domo86": "332", "kilo12": "60"}


def test_a_working_from_a_misread_noted_value_is_questioned():
    outcome, sent = run(
        "Mira Lowe took 25 from domo86.",
        HELD,
        ["SET domo86 = -382 (= -357 - 25)", "SET domo86 = 332 (= 357 - 25)"],
    )
    assert sent[1] is not None and "the NOTES hold 357 for domo86" in sent[1]
    assert outcome.notes.state_dict()["domo86"] == "332"


def test_a_change_skimmed_past_is_questioned():
    text = "Mira Lowe took 25 from domo86. Next on the list was kilo12. Oona added 7 to it."
    outcome, sent = run(
        text,
        HELD,
        [
            "SET domo86 = 357\nSET kilo12 = 100",
            "SET domo86 = 332 (= 357 - 25)\nSET kilo12 = 107 (= 100 + 7)",
        ],
    )
    assert sent[1] is not None
    assert "the turns state 25 about domo86" in sent[1]
    assert "the turns state 7 about kilo12" in sent[1]
    assert outcome.notes.state_dict() == {"domo86": "332", "kilo12": "107"}


def test_a_line_that_follows_the_text_is_not_questioned():
    text = (
        "The clerk recorded domo86 at 300. Mira Lowe took 25 from it. "
        "Correction: that should have read 30. Oona Wren took 40 from kilo12."
    )
    reply = "SET domo86 = 270 (= 300 - 30)\nSET kilo12 = 60 (= 100 - 40)"
    assert WorkingFollowsText().check([], _context(text)) == []
    outcome, sent = run(text, HELD, [reply])
    assert sent == [None]
    assert outcome.notes.state_dict() == {"domo86": "270", "kilo12": "60"}


def test_a_second_reading_replaces_only_the_questioned_lines():
    # the second reading fixes domo86 but skims past kilo12's change (a line no check
    # questions once left out): the first reading's kilo12 stands
    first = "SET domo86 = 317 (= 357 - 40)\nSET kilo12 = 60 (= 100 - 40)"
    again = "SET domo86 = 332 (= 357 - 25)"
    outcome, sent = run(TEXT, HELD, [first, again])
    assert len(sent) == 2
    assert outcome.notes.state_dict() == {"domo86": "332", "kilo12": "60"}
    assert (outcome.asks, outcome.reasks) == (2, 1)


def test_the_keeper_reads_a_questioned_batch_again_before_it_enters_the_notes():
    def reply(messages: list[BaseMessage]) -> str:
        kind = keeper_kind(messages[-1])
        if kind == "notes_reask":
            return "SET domo86 = 332 (= 357 - 25)"
        if kind != "notes_request":
            return "Noted."
        said = "\n".join(text_of(m) for m in messages if keeper_kind(m) is None)
        if any("domo86 = 332" in text_of(m) for m in messages if keeper_kind(m) == "notes"):
            return "NO CHANGES"  # item 2, kept in view after the cut, is noted already
        if "took 25 from domo86" in said:
            return "SET domo86 = 357"  # the change skimmed past
        return "SET domo86 = 357" if "recorded domo86" in said else "NO CHANGES"

    keeper = Keeper(KeeperConfig(window=2048, reply_reserve=256, notes_every_items=2))
    agent = create_keeper_agent(
        ScriptedChatModel(default=reply), keeper=keeper, checkpointer=InMemorySaver()
    )
    thread: RunnableConfig = {"configurable": {"thread_id": "t"}}
    agent.invoke({"messages": [HumanMessage("Task: read the items.")]}, thread)
    story = ["The clerk recorded domo86 at 357.", "Mira Lowe took 25 from domo86."]
    story += ["The mill was quiet."] * 8
    for item, sentence in enumerate(story, start=1):
        agent.invoke({"messages": [HumanMessage(f"Item {item}.\n{sentence}")]}, thread)
    assert keeper.counters("t").reasks >= 1
    assert keeper.notes("t").state_dict() == {"domo86": "332"}


def _context(text: str):
    from keeper_middleware.notes.checks import CheckContext

    return CheckContext(noted_text=text, notes=HELD)


def test_a_line_questioned_on_both_readings_is_kept_without_a_third():
    # questioned again on the second reading: the line stands, with no third whole request
    text = "Mira Lowe took 25 from domo86."
    outcome, sent = run(text, HELD, ["SET domo86 = 357", "SET domo86 = 357"])
    assert len(sent) == 2
    assert outcome.notes.state_dict()["domo86"] == "357"
    assert [issue.check for issue in outcome.unresolved] == ["working_follows_text"]
