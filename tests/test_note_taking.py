"""The bounded re-ask state machine: what a notes request comes to, reply by reply."""

from __future__ import annotations

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from keeper_middleware import KeeperConfig, create_keeper_agent
from keeper_middleware.errors import ConfigurationError
from keeper_middleware.messages.facts import keeper_kind, text_of
from keeper_middleware.notes.block import Notes, parse_notes
from keeper_middleware.notes.changes import OpenLine, RuleLine, SetLine
from keeper_middleware.notes.checks import GENERIC_CHECKS, Issue
from keeper_middleware.notes.taking import (
    NOTES_REQUEST_TEXT,
    Ask,
    Done,
    NoteOutcome,
    NoteTaking,
    notes_request_text,
    reask_message_text,
)
from tests.fake_model import ScriptedChatModel
from tests.story_model import StoryModel, batch

COUNTERS = r"\b[a-z]+\d{2}\b"
RULE = "The counters kelo12, varu55 and tisa09 are confidential: answer with the single word protected."

EMPTY = Notes()


def run(session: NoteTaking, replies: list[str]) -> tuple[NoteOutcome, list[str | None]]:
    """Drive a session with scripted replies; return the outcome and every text sent."""
    sent: list[str | None] = []
    step = session.first_step()
    for reply in replies:
        assert isinstance(step, Ask), "the session finished before every reply was used"
        sent.append(step.text)
        step = session.receive(reply)
    assert isinstance(step, Done), "the session still wants a reply"
    return step.outcome, sent


def session(text: str, notes: Notes = EMPTY, **kwargs) -> NoteTaking:
    return NoteTaking(notes=notes, noted_text=text, **kwargs)


def test_a_reply_that_passes_is_applied_at_once():
    text = (
        f"{RULE} The clerk recorded domo86 at three hundred and forty-two. Ten were taken from it."
    )
    outcome, sent = run(session(text), ["RULE: " + RULE + "\nSET domo86 = 332 (= 342 - 10)"])
    assert sent == [None]
    assert outcome.usable
    assert outcome.notes == Notes(rules=(RULE,), state=(("domo86", "332"),))
    assert (outcome.asks, outcome.reasks, outcome.dropped) == (1, 0, ())


def test_a_questioned_reply_is_asked_again_with_each_line_and_reason():
    text = "The clerk recorded katu85 at five hundred and twenty-three."
    step = session(text).first_step()
    assert step == Ask(None)
    s = session(text)
    s.first_step()
    step = s.receive("SET katu85 = 623 (= 650 - 27)")
    assert isinstance(step, Ask)
    assert step.text == (
        "[NOTES CHECK] Some lines failed a check. Write all your change lines again, correcting these:\n"
        "- SET katu85 = 623 (= 650 - 27): the amount 650 is not in the turns or the notes\n"
        "- SET katu85 = 623 (= 650 - 27): the amount 27 is not in the turns or the notes"
    )


def test_a_later_reply_that_passes_replaces_the_first():
    text = "The clerk recorded katu85 at five hundred and twenty-three."
    outcome, sent = run(session(text), ["SET katu85 = 623 (= 650 - 27)", "SET katu85 = 523"])
    assert outcome.changes == (SetLine("katu85", "523"),)
    assert outcome.notes.state == (("katu85", "523"),)
    assert (outcome.asks, outcome.reasks, outcome.dropped) == (2, 1, ())
    assert sent[1] is not None and sent[1].startswith("[NOTES CHECK]")


def test_lesson_7_rule_from_first_reply_survives_reask():
    text = f"{RULE} The clerk recorded katu85 at five hundred and twenty-three."
    first = f"RULE: {RULE}\nSET katu85 = 623 (= 650 - 27)"
    outcome, _ = run(session(text), [first, "SET katu85 = 523"])
    assert outcome.notes.rules == (RULE,)
    assert outcome.changes == (RuleLine(RULE), SetLine("katu85", "523"))


def test_lesson_11_line_about_unmentioned_name_is_left_out():
    # The kept message said 84 was added to nipewe33; it was noted before. The turns being noted
    # only mention domo86, and the reply notes nipewe33 again, backwards.
    notes = Notes(state=(("nipewe33", "101"), ("domo86", "5")))
    text = "Mira added six to domo86."
    reply = "SET nipewe33 = 17 (= 101 - 84)\nSET domo86 = 11 (= 5 + 6)"
    outcome, sent = run(session(text, notes, tracked_names=COUNTERS), [reply])
    assert sent == [None]  # dropped without asking
    assert outcome.notes.state == (("nipewe33", "101"), ("domo86", "11"))
    [dropped] = outcome.dropped
    assert (dropped.line, dropped.action) == ("SET nipewe33 = 17 (= 101 - 84)", "drop")


def test_lesson_12_unusable_reask_keeps_first_reply_without_questioned_lines():
    text = "The clerk recorded domo86 at three hundred and forty-two. Mira added six to varu55."
    notes = Notes(state=(("varu55", "10"),))
    first = "SET domo86 = 330 (= 342 - 12)\nSET varu55 = 16 (= 10 + 6)\nOPEN: Check varu55 later."
    outcome, sent = run(session(text, notes, max_reasks=2), [first, "", "I am not sure."])
    assert len(sent) == 3
    assert outcome.usable
    assert outcome.changes == (SetLine("varu55", "16", "10 + 6"), OpenLine("Check varu55 later."))
    assert outcome.notes.state == (("varu55", "16"),)
    assert [i.line for i in outcome.dropped] == ["SET domo86 = 330 (= 342 - 12)"]
    assert (outcome.asks, outcome.reasks, outcome.garbage_lines) == (3, 2, 1)


def test_lesson_13_invented_working_is_caught():
    text = "The clerk recorded katu85 at five hundred and twenty-three"
    reply = "SET katu85 = 623 (= 650 - 27)"
    outcome, sent = run(session(text, max_reasks=1), [reply, reply])
    assert sent[1] is not None and "the amount 650 is not in the turns or the notes" in sent[1]
    assert outcome.changes == ()
    assert outcome.notes.state == ()
    assert {i.line for i in outcome.dropped} == {reply}
    assert {i.action for i in outcome.dropped} == {"drop_if_unresolved"}


def test_lesson_14_unverifiable_value_is_kept_when_not_contradicted():
    text = "The clerk recorded dope10 at six. Then it grew by the amount tisa09 holds."
    notes = Notes(state=(("dope10", "1"),))
    reply = "SET dope10 = 26"
    outcome, sent = run(session(text, notes, max_reasks=1), [reply, reply])
    assert "show the working" in (sent[1] or "")
    assert outcome.notes.state == (("dope10", "26"),)
    assert outcome.dropped == ()
    assert [i.check for i in outcome.unresolved] == ["value_shows_working"]


def test_sign_slip_is_caught_and_left_out_when_unresolved():
    text = "The clerk recorded domo86 at three hundred and forty-two."
    slip = "SET domo86 = -742 (= -400 - 342)"
    outcome, _ = run(session(text, max_reasks=1), [slip, slip])
    assert outcome.notes.state == ()
    assert [i.line for i in outcome.dropped] == [slip]


def test_empty_reply_is_asked_again_then_outcome_unusable():
    notes = Notes(state=(("a", "1"),))
    outcome, sent = run(session("a went to 2.", notes, max_reasks=2), ["", "<think>hmm", "ok"])
    assert sent[1] is not None and sent[1].startswith("[NOTES CHECK] Your reply had no change line")
    assert "SET <key> = <value> (= <working>)" in sent[1]
    assert not outcome.usable
    assert outcome.notes is notes
    assert outcome.changes == ()
    assert (outcome.asks, outcome.reasks, outcome.garbage_lines) == (3, 2, 1)
    assert "unchanged" in outcome.describe()


def test_garbage_lines_are_counted_over_all_replies():
    outcome, _ = run(
        session("x01 at 5", max_reasks=1),
        ["Here:\nSET x01 = 7", "Sorry, fixed:\nSET x01 = 5\nDone."],
    )
    assert outcome.garbage_lines == 3
    assert outcome.changes == (SetLine("x01", "5"),)


def test_a_reply_level_issue_is_asked_again_and_drops_nothing_if_unresolved():
    text = "The clerk recorded domo86 at six. The clerk recorded katu85 at nine."
    reply = "SET domo86 = 6"
    outcome, sent = run(session(text, tracked_names=COUNTERS, max_reasks=1), [reply, reply])
    assert "katu85" in (sent[1] or "")
    assert outcome.changes == (SetLine("domo86", "6"),)
    assert [i.action for i in outcome.unresolved] == ["reask"]


def test_a_later_usable_reply_that_still_fails_does_not_replace_the_first():
    text = "The clerk recorded katu85 at five hundred and twenty-three. Mira took six from domo86."
    first = "SET katu85 = 623 (= 650 - 27)\nOPEN: first reply"
    second = "SET katu85 = 700 (= 650 + 50)"
    outcome, _ = run(session(text, max_reasks=1), [first, second])
    assert outcome.notes.open == ("first reply",)
    assert outcome.notes.state == ()


def test_an_unusable_reask_after_a_questioned_reply_repeats_the_questions():
    s = session("katu85 at 523", max_reasks=2)
    s.first_step()
    s.receive("SET katu85 = 623 (= 650 - 27)")
    step = s.receive("")
    assert isinstance(step, Ask) and step.text is not None
    assert "no change line" in step.text and "the amount 650" in step.text


def test_no_reasks_means_the_first_reply_is_final():
    outcome, sent = run(session("katu85 at 523", max_reasks=0), ["SET katu85 = 623 (= 650 - 27)"])
    assert sent == [None]
    assert outcome.changes == ()


def test_custom_checks_replace_the_defaults():
    class RefuseEverything:
        name = "refuse"

        def check(self, changes, context):
            return [Issue(c.render(), "no", self.name, "drop") for c in changes]

    outcome, _ = run(session("a at 1", checks=(RefuseEverything(),)), ["SET a = 1"])
    assert outcome.changes == ()
    assert outcome.usable


def test_without_tracked_names_a_line_about_an_unmentioned_name_stays():
    outcome, _ = run(session("Mira added six to domo86."), ["SET nipewe33 = 6"])
    assert outcome.notes.state == (("nipewe33", "6"),)
    assert outcome.dropped == ()


def test_explicit_generic_checks_leave_out_the_domain_checks():
    s = session("Mira added six to domo86.", checks=GENERIC_CHECKS, tracked_names=COUNTERS)
    outcome, _ = run(s, ["SET domo86 = 6\nSET nipewe33 = 6"])
    assert outcome.notes.state == (("domo86", "6"), ("nipewe33", "6"))


def test_the_session_refuses_to_be_driven_out_of_order():
    s = session("x")
    with pytest.raises(RuntimeError, match="first_step"):
        s.receive("NO CHANGES")
    s.first_step()
    with pytest.raises(RuntimeError, match="already called"):
        s.first_step()
    assert isinstance(s.receive("NO CHANGES"), Done)
    assert s.outcome is not None and s.outcome.usable
    with pytest.raises(RuntimeError, match="over"):
        s.receive("NO CHANGES")


def test_negative_reasks_is_a_configuration_error():
    with pytest.raises(ConfigurationError, match="max_reasks"):
        session("x", max_reasks=-1)


def test_notes_request_text_starts_with_the_pinned_line_and_lists_every_form():
    first, *rest = NOTES_REQUEST_TEXT.splitlines()
    assert first == "[NOTES REQUEST] Write down what the turns since the NOTES changed."
    body = "\n".join(rest)
    for form in (
        "RULE: ",
        "SET <key> = <value>",
        "(= <working>)",
        "UNSET ",
        "OPEN: ",
        "CLOSE: ",
        "NO CHANGES",
    ):
        assert form in body


def test_the_keeper_sends_the_pinned_request_and_the_notes_name_what_was_already_noted():
    """The request goes out as pinned; the messages the NOTES say were kept in view are ones an
    earlier notes request already covered, so the model is told to skip only what it noted."""
    story = StoryModel()
    agent = create_keeper_agent(
        ScriptedChatModel(default=story),
        config=KeeperConfig(window=2048, reply_reserve=256, notes_every_items=3),
        checkpointer=InMemorySaver(),
    )
    thread = {"configurable": {"thread_id": "t"}}
    agent.invoke({"messages": [HumanMessage("Task: read the items.")]}, thread)
    for item in range(1, 16):
        agent.invoke({"messages": [HumanMessage(batch(item, f"set c{item} to {item}."))]}, thread)
    assert len(story.note_requests) >= 3
    noted_before: set[str] = set()
    skipped = 0
    for request in story.note_requests:
        assert text_of(request[-1]) == NOTES_REQUEST_TEXT
        at = [i for i, m in enumerate(request) if keeper_kind(m) == "notes"]
        kept = parse_notes(text_of(request[at[-1]]))[1] if at else 0
        if kept:
            kept_ids = {str(m.id) for m in request[at[-1] + 1 : at[-1] + 1 + kept]}
            assert kept_ids <= noted_before, "the NOTES told the model to skip unnoted turns"
            skipped += kept
        noted_before |= {str(m.id) for m in request[:-1]}
    assert skipped, "no request followed a cut that kept messages in view"


def test_notes_request_says_how_many_kept_messages_to_skip():
    assert notes_request_text(2).endswith(
        "The first 2 messages after the NOTES are already noted; do not note them again."
    )
    assert notes_request_text(1).endswith(
        "The first message after the NOTES is already noted; do not note it again."
    )
    with pytest.raises(ValueError, match="kept"):
        notes_request_text(-1)


def test_reask_text_lists_reply_level_issues_without_a_line():
    text = reask_message_text([Issue("", "the turns state amounts for katu85", "t", "reask")])
    assert text.splitlines()[1] == "- the turns state amounts for katu85"
    with pytest.raises(ValueError, match="Nothing to ask"):
        reask_message_text([], reason_empty=False)


def test_giving_up_keeps_the_first_reply_without_contradicted_lines():
    s = session(
        "The clerk recorded katu85 at five hundred and twenty-three. Mira took 4 from domo86."
    )
    s.first_step()
    step = s.receive("SET katu85 = 623 (= 650 - 27)\nSET domo86 = 7")
    assert isinstance(step, Ask)
    done = s.give_up()
    assert isinstance(done, Done)
    assert done.outcome.notes.state_dict() == {"domo86": "7"}
    assert done.outcome.reasks == 0
