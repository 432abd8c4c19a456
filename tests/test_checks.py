"""Checks on note changes: what each one questions, and how sure it is."""

from __future__ import annotations

import re

import pytest

from keeper_middleware.errors import ConfigurationError
from keeper_middleware.notes.block import Notes
from keeper_middleware.notes.changes import RuleLine, SetLine, UnsetLine, parse_changes
from keeper_middleware.notes.checks import (
    GENERIC_CHECKS,
    AmountsInText,
    CheckContext,
    KeysGrounded,
    NamesMentioned,
    RulesQuoted,
    SignsAgree,
    TrackedNamesAccounted,
    ValueShowsWorking,
    WorkingArithmetic,
    WorkingError,
    WorkingFollowsText,
    default_checks,
    evaluate_working,
    run_checks,
)

COUNTERS = re.compile(r"\b[a-z]+\d{2}\b")

EMPTY = Notes()


def context(text: str, notes: Notes = EMPTY, names: re.Pattern[str] | None = None):
    return CheckContext(noted_text=text, notes=notes, tracked_names=names)


def issues_for(reply: str, ctx: CheckContext, checks=GENERIC_CHECKS):
    return run_checks(parse_changes(reply).changes, ctx, checks)


@pytest.mark.parametrize(
    ("working", "value"),
    [
        ("342 - 10", 332),
        ("(342 - 10) * 2", 664),
        ("-400 - 342", -742),
        ("5 × 3 + 13", 28),
        ("5x3", 15),
        ("20 − 4", 16),
        ("1,204 + 1", 1205),
        ("10 / 4", 2.5),
        ("342 - 10 = 332", 332),
        ("+7", 7),
    ],
)
def test_working_is_evaluated_as_arithmetic(working, value):
    assert evaluate_working(working)[0] == pytest.approx(value)


@pytest.mark.parametrize(
    "working", ["342 minus ten", "domo86 - 10", "2 ** 8", "__import__('os')", "4 / 0", ""]
)
def test_anything_but_plain_arithmetic_is_refused(working):
    with pytest.raises(WorkingError):
        evaluate_working(working)


def test_working_reports_the_amounts_it_uses():
    assert evaluate_working("(342 - 10) * -2")[1] == [342.0, 10.0, 2.0]


TEXT_342 = "The clerk recorded domo86 at three hundred and forty-two. Ten were taken from it."


def test_correct_working_from_the_text_passes_every_generic_check():
    assert issues_for("SET domo86 = 332 (= 342 - 10)", context(TEXT_342)) == []


def test_number_words_in_the_text_count_as_amounts():
    ctx = context("Mira took twelve from domo86, which had stood at one thousand and four.")
    assert issues_for("SET domo86 = 992 (= 1004 - 12)", ctx) == []


def test_wrong_sum_is_contradicted():
    [issue] = issues_for("SET domo86 = 322 (= 342 - 10)", context(TEXT_342))
    assert issue.check == "working_arithmetic"
    assert issue.action == "drop_if_unresolved"
    assert issue.reason == "the working comes to 332, not 322"
    assert issue.line == "SET domo86 = 322 (= 342 - 10)"


def test_sign_slip_with_an_amount_not_in_the_text_is_caught():
    issues = issues_for("SET domo86 = -742 (= -400 - 342)", context(TEXT_342))
    assert [(i.check, i.action) for i in issues] == [("amounts_in_text", "drop_if_unresolved")]
    assert issues[0].reason == "the amount 400 is not in the turns or the notes"


def test_amounts_from_the_notes_state_and_rules_may_be_used():
    notes = Notes(
        rules=("A counter's tally is its value times five plus thirteen.",),
        state=(("domo86", "332"),),
    )
    ctx = context("Seven were added to domo86.", notes)
    assert issues_for("SET domo86 = 339 (= 332 + 7)", ctx) == []
    assert issues_for("SET tally = 1708 (= 339 * 5 + 13)", context("339 now.", notes)) == []


def test_implied_multipliers_count_as_amounts():
    ctx = context("The stock of varu55, which stood at 40, was doubled.")
    assert issues_for("SET varu55 = 80 (= 40 * 2)", ctx) == []


def test_a_value_rounded_as_written_matches_its_working():
    ctx = context("A third of the 100 in tisa09 was kept.")
    assert issues_for("SET tisa09 = 33.33 (= 100 / 3)", ctx) == []
    [issue] = issues_for("SET tisa09 = 33 (= 100 / 3)", ctx)
    assert issue.action == "drop_if_unresolved"


def test_unreadable_working_is_questioned_but_not_contradicted():
    [issue] = issues_for("SET domo86 = 332 (= 342 minus ten)", context(TEXT_342))
    assert issue.check == "working_arithmetic"
    assert issue.action == "keep_if_unresolved"


def test_working_for_a_value_that_is_not_a_number_is_questioned():
    [issue] = issues_for("SET status = done (= 1 + 1)", context("1 thing"))
    assert issue.action == "keep_if_unresolved"


def test_stated_value_without_working_passes():
    ctx = context("The clerk recorded dope10 at six.")
    assert issues_for("SET dope10 = 6", ctx) == []


def test_value_without_working_that_the_text_does_not_state_is_only_questioned():
    [issue] = issues_for("SET dope10 = 16", context("The clerk recorded dope10 at six."))
    assert (issue.check, issue.action) == ("value_shows_working", "keep_if_unresolved")
    assert "show the working" in issue.reason


def test_value_without_working_passes_when_it_is_already_the_noted_value_or_zero():
    notes = Notes(state=(("dope10", "16"),))
    ctx = context("dope10 was mentioned.", notes)
    assert issues_for("SET dope10 = 16\nSET empty01 = 0", ctx) == []


def test_text_values_are_not_questioned_as_numbers():
    assert issues_for("SET owner = Mira", context("Mira has it.")) == []


def test_line_about_a_name_the_turns_never_mention_is_dropped():
    ctx = context(TEXT_342, names=COUNTERS)
    issues = run_checks(
        [SetLine("katu85", "84"), UnsetLine("nipewe33"), SetLine("domo86", "342")],
        ctx,
        [NamesMentioned()],
    )
    assert [(i.line, i.action) for i in issues] == [
        ("SET katu85 = 84", "drop"),
        ("UNSET nipewe33", "drop"),
    ]
    assert issues[0].reason == "katu85 is not mentioned in the turns being noted"


def test_keys_that_are_not_tracked_names_are_not_dropped():
    issues = run_checks(
        [SetLine("weather", "rain")], context("x", names=COUNTERS), [NamesMentioned()]
    )
    assert issues == []


def test_a_tracked_name_given_an_amount_must_be_accounted_for():
    text = TEXT_342 + " The clerk recorded katu85 at five. What does nipewe33 hold now?"
    ctx = context(text, names=COUNTERS)
    [issue] = run_checks([SetLine("domo86", "332", "342 - 10")], ctx, [TrackedNamesAccounted()])
    assert (issue.line, issue.action) == ("", "reask")
    assert "katu85" in issue.reason
    assert "nipewe33" not in issue.reason  # a question states nothing


def test_a_rule_naming_the_counters_accounts_for_them():
    text = "Rule: kelo12 and varu55 are confidential, from item 1 on."
    ctx = context(text, names=COUNTERS)
    changes = [RuleLine("kelo12 and varu55 are confidential, from item 1 on.")]
    assert run_checks(changes, ctx, [TrackedNamesAccounted()]) == []


def test_tracked_name_checks_do_nothing_without_a_pattern():
    ctx = context(TEXT_342)
    assert (
        run_checks([SetLine("katu85", "84")], ctx, [NamesMentioned(), TrackedNamesAccounted()])
        == []
    )


def test_default_checks_add_the_domain_checks_only_when_names_are_given():
    assert default_checks(None) == GENERIC_CHECKS
    checks = default_checks(r"\b[a-z]+\d{2}\b")
    assert [c.name for c in checks] == [
        "working_arithmetic",
        "amounts_in_text",
        "signs_agree",
        "value_shows_working",
        "working_follows_text",
        "rules_quoted",
        "keys_grounded",
        "names_mentioned",
        "tracked_names_accounted",
    ]
    [issue] = run_checks([SetLine("katu85", "5")], context("nothing here 5"), checks)
    assert issue.action == "drop"


def test_a_bad_names_pattern_is_a_configuration_error_that_says_the_fix():
    with pytest.raises(ConfigurationError, match="valid regular expression"):
        default_checks("([a-z")


def test_generic_checks_are_instances_of_the_named_classes():
    assert [type(c) for c in GENERIC_CHECKS] == [
        WorkingArithmetic,
        AmountsInText,
        SignsAgree,
        ValueShowsWorking,
        WorkingFollowsText,
        RulesQuoted,
        KeysGrounded,
    ]


def test_a_rule_must_be_quoted_from_the_turns():
    text = "Standing rule: every answer is in digits. The rain went on."
    checks = [RulesQuoted()]
    assert (
        run_checks([RuleLine("Standing rule: every answer is in digits.")], context(text), checks)
        == []
    )
    [template] = run_checks([RuleLine("<text> — a standing rule or method")], context(text), checks)
    assert template.action == "drop"  # no instruction: asking again cannot make it one
    [restated] = run_checks([RuleLine("Always read every item carefully")], context(text), checks)
    assert "word for word" in restated.reason


SET_TEXT = "Mira Holt recorded domo86 at three hundred and forty-two. The rain went on."
TAKE_TEXT = "Ten were taken from domo86 by Tomas Quill. The rain went on."
ADD_TEXT = "Mira Holt added 7 to domo86."


@pytest.mark.parametrize(
    ("text", "notes", "reply"),
    [
        # a value stated outright, read with the wrong sign
        (SET_TEXT, EMPTY, "SET domo86 = -342"),
        ("Mira Holt recorded domo86 at minus six.", EMPTY, "SET domo86 = 6"),
        # a working that starts from a misread value
        (f"{SET_TEXT} {TAKE_TEXT}", EMPTY, "SET domo86 = -352 (= -342 - 10)"),
        # a take worked as an add, an add worked as a take
        (TAKE_TEXT, Notes(state=(("domo86", "342"),)), "SET domo86 = 352 (= 342 + 10)"),
        (ADD_TEXT, Notes(state=(("domo86", "342"),)), "SET domo86 = 335 (= 342 - 7)"),
        (
            "domo86 lost 5 when Mira Holt dropped a crate.",
            Notes(state=(("domo86", "9"),)),
            "SET domo86 = 14 (= 9 + 5)",
        ),
        (
            "domo86 was debited 5 by Yara Fell.",
            Notes(state=(("domo86", "9"),)),
            "SET domo86 = 14 (= 9 + 5)",
        ),
        (
            "Yara Fell raised domo86 by 5.",
            Notes(state=(("domo86", "9"),)),
            "SET domo86 = 4 (= 9 - 5)",
        ),
    ],
)
def test_a_flipped_sign_is_contradicted_and_asked_again(text, notes, reply):
    issues = issues_for(reply, context(text, notes), [SignsAgree()])
    assert [i.action for i in issues] == ["drop_if_unresolved"]
    assert "sign is wrong" in issues[0].reason


@pytest.mark.parametrize(
    ("text", "notes", "reply"),
    [
        (SET_TEXT, EMPTY, "SET domo86 = 342"),
        ("Mira Holt recorded domo86 at minus six.", EMPTY, "SET domo86 = -6"),
        (f"{SET_TEXT} {TAKE_TEXT}", EMPTY, "SET domo86 = 332 (= 342 - 10)"),
        (ADD_TEXT, Notes(state=(("domo86", "-5"),)), "SET domo86 = 2 (= -5 + 7)"),
        # a held amount: another counter's working in parentheses is not this line's to judge
        (
            f"{TAKE_TEXT} Mira Holt took from kelo12 as much as domo86 held.",
            Notes(state=(("domo86", "342"), ("kelo12", "400"))),
            "SET kelo12 = 68 (= 400 - (342 - 10))",
        ),
        # the tally method: a product is one term, and 13 comes from a rule
        (
            "Mira Holt recorded domo86 at 9.",
            Notes(rules=("tally is value times 5 plus 13",)),
            "SET tally = 58 (= 9 * 5 + 13)",
        ),
        # an amount stated both taken and added, or from the notes, is not judged
        (
            "Mira took 4 from domo86. Tomas added 4 to kelo12.",
            Notes(state=(("domo86", "9"),)),
            "SET domo86 = 13 (= 9 + 4)",
        ),
        # a take that goes below zero shows its working; the bare value is another check's
        (TAKE_TEXT, Notes(state=(("domo86", "0"),)), "SET domo86 = -10"),
        # a name that is also a verb is a name ("Fell" took nothing)
        (
            "Yara Fell put 8 more into domo86.",
            Notes(state=(("domo86", "64"),)),
            "SET domo86 = 72 (= 64 + 8)",
        ),
        (
            "domo86 was credited with 8 by Oona Fell.",
            Notes(state=(("domo86", "1"),)),
            "SET domo86 = 9 (= 1 + 8)",
        ),
    ],
)
def test_signs_that_agree_with_the_text_pass(text, notes, reply):
    assert issues_for(reply, context(text, notes), [SignsAgree()]) == []


def test_a_negative_value_the_text_never_states_must_show_its_working():
    [issue] = issues_for("SET domo86 = -10", context(TAKE_TEXT), [ValueShowsWorking()])
    assert issue.action == "keep_if_unresolved"
    assert issues_for("SET domo86 = 10", context(TAKE_TEXT), [ValueShowsWorking()]) == []


def test_a_change_that_finishes_an_open_entry_is_kept_though_the_turns_do_not_name_it():
    notes = Notes(state=(("domo86", "342"),), open=("Viktor Marsh began a recount of domo86.",))
    text = "The recount begun in the previous item came to 679. The rain went on."
    check = [NamesMentioned(COUNTERS)]
    assert issues_for("SET domo86 = 679", context(text, notes), check) == []
    [issue] = issues_for("SET kelo12 = 679", context(text, notes), check)
    assert issue.action == "drop"
