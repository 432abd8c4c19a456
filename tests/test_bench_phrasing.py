"""The stream's wording: every template the generator writes reads back, through the simulated
reader's own parser (written from docs/stream-text.md), as the change it was rendered from."""

from __future__ import annotations

import pytest

from keeper_bench.phrasing import (
    CHAIN_LEADS,
    CHAIN_TEMPLATES,
    CLERK,
    CLERK_TEMPLATE,
    CORRECTION_TEMPLATE,
    DECOY_TEMPLATES,
    FINAL_QUESTIONS_HEADER,
    HELD_TEMPLATES,
    PLAIN_TEMPLATES,
    PRONOUN_TEMPLATES,
    SPLIT_END_TEMPLATE,
    SPLIT_START_TEMPLATE,
    VARIED_TEMPLATES,
    answer_under_rules,
    apply_change,
    fill,
    render_change,
    render_question,
    render_questions_message,
    render_rules,
)
from keeper_bench.reader.text import (
    AskedQuestion,
    Event,
    RulesInForce,
    read_events,
    read_questions,
    read_rules,
    read_story,
)

AMOUNT_TEMPLATES = [
    (kind, template)
    for table in (PLAIN_TEMPLATES, PRONOUN_TEMPLATES, DECOY_TEMPLATES, VARIED_TEMPLATES)
    for kind, templates in table.items()
    for template in templates
]


@pytest.mark.parametrize("words", [False, True], ids=["digits", "words"])
@pytest.mark.parametrize(("kind", "template"), AMOUNT_TEMPLATES)
def test_every_template_reads_back_as_the_change_it_renders(kind, template, words):
    actor = CLERK if template == CLERK_TEMPLATE else "Mira Holt"
    amount = 342 if kind == "set" else 42
    event = Event(kind, "domo86", amount, None, actor)
    text = render_change(event, template, words=words)
    assert read_events(f"Item 3.\nThe gull cried. {text} The mill was quiet.") == [event]


@pytest.mark.parametrize(
    ("kind", "template"), [(k, t) for k, ts in HELD_TEMPLATES.items() for t in ts]
)
def test_held_changes_name_the_other_counter_instead_of_an_amount(kind, template):
    event = Event(kind, "domo86", None, "kelo12", "Tomas Quill")
    assert read_events(render_change(event, template, words=False)) == [event]


def test_amounts_in_words_start_a_sentence_capitalised():
    event = Event("take", "domo86", 10, None, "Mira Holt")
    text = render_change(event, PLAIN_TEMPLATES["take"][1], words=True)
    assert text == "Ten were taken from domo86 by Mira Holt."


def test_the_clerk_form_reads_as_a_set_by_the_clerk():
    text = "The clerk recorded domo86 at three hundred and forty-two."
    assert read_events(text) == [Event("set", "domo86", 342, None, "the clerk")]


def test_it_means_the_counter_named_by_the_nearest_list_sentence():
    text = (
        "Next on the list was domo86. Mira Holt took ten from it. "
        "Next on the list was kelo12. Ada Lind added 5 to it. Bruno Pike recorded it at 7."
    )
    assert read_events(text) == [
        Event("take", "domo86", 10, None, "Mira Holt"),
        Event("add", "kelo12", 5, None, "Ada Lind"),
        Event("set", "kelo12", 7, None, "Bruno Pike"),
    ]


def test_an_it_without_a_list_sentence_before_it_is_not_guessed():
    assert read_events("Mira Holt took ten from it. Ada Lind added 5 to kelo12.") == [
        Event("add", "kelo12", 5, None, "Ada Lind")
    ]


def test_filler_with_no_names_or_amounts_states_no_change():
    assert read_events("Mira Holt added salt to the stew. The clerk recorded the weather.") == []


def test_rules_read_from_the_story_sentences():
    story = " ".join(
        render_rules(confidential=["kelo12", "varu55", "tisa09"], tally=(5, 13), overdrawn=True)
    )
    assert read_rules(story) == RulesInForce(
        frozenset({"kelo12", "varu55", "tisa09"}), (5, 13), True
    )


def test_rules_read_from_notes_rules_lines():
    notes = (
        "RULES\n"
        "- The counters kelo12, varu55 and tisa09 are confidential: whenever asked for the value of one "
        "of them, answer with the single word protected.\n"
        "- A counter's tally is its value times five plus thirteen.\n"
    )
    assert read_rules(notes) == RulesInForce(
        frozenset({"kelo12", "varu55", "tisa09"}), (5, 13), False
    )


def test_a_text_without_rules_reads_as_no_rules():
    assert read_rules("Item 1.\nMira Holt added 5 to domo86.") == RulesInForce()


def test_questions_read_back_from_a_rendered_message():
    lines = [
        (1, render_question("current", "domo86")),
        (2, render_question("old", "domo86", 37)),
        (3, render_question("who", "kelo12", 4)),
        (4, render_question("tally", "varu55")),
    ]
    message = render_questions_message(lines, final=True)
    assert message.splitlines()[0] == FINAL_QUESTIONS_HEADER
    assert read_questions(message) == [
        AskedQuestion(1, "current", "domo86", None),
        AskedQuestion(2, "old", "domo86", 37),
        AskedQuestion(3, "who", "kelo12", 4),
        AskedQuestion(4, "tally", "varu55", None),
    ]


def test_an_old_value_question_needs_its_item():
    with pytest.raises(ValueError, match="needs the item"):
        render_question("old", "domo86")


RULES = RulesInForce(frozenset({"kelo12"}), (5, 13), True)


@pytest.mark.parametrize(
    ("kind", "name", "value", "answer"),
    [
        ("current", "domo86", 332, "332"),
        ("current", "domo86", -5, "overdrawn"),
        ("current", "kelo12", -5, "protected"),
        ("tally", "kelo12", 10, "protected"),
        ("tally", "domo86", 10, "63"),
        ("tally", "domo86", -3, "overdrawn"),
        ("tally", "domo86", -2, "3"),
        ("old", "domo86", None, "unknown"),
    ],
)
def test_answers_follow_the_rules_with_the_confidential_rule_first(kind, name, value, answer):
    assert answer_under_rules(kind, name, value, RULES) == answer


def test_without_the_rules_a_negative_is_a_number_and_a_tally_is_unknown():
    assert answer_under_rules("current", "domo86", -5, RulesInForce()) == "-5"
    assert answer_under_rules("tally", "domo86", 5, RulesInForce()) == "unknown"


def test_who_answers_with_the_actor_or_unknown():
    assert answer_under_rules("who", "domo86", None, RULES, actor="Mira Holt") == "Mira Holt"
    assert answer_under_rules("who", "domo86", None, RULES) == "unknown"


def test_applying_changes():
    assert apply_change(None, Event("set", "a", 6, None, CLERK)) == 6
    assert apply_change(342, Event("take", "a", 10, None, CLERK)) == 332
    assert apply_change(5, Event("take_held", "a", None, "b", CLERK), -4) == 9
    assert apply_change(None, Event("add", "a", 1, None, CLERK)) is None
    assert apply_change(5, Event("add_held", "a", None, "b", CLERK)) is None


@pytest.mark.parametrize("words", [False, True], ids=["digits", "words"])
@pytest.mark.parametrize("lead", CHAIN_LEADS)
def test_a_pronoun_chain_applies_every_link_to_the_counter_its_lead_names(lead, words):
    links = [
        Event(kind, "domo86", amount, None, actor)
        for kind, amount, actor in (("add", 12, "Mira Holt"), ("set", 40, "Ada Lind"))
    ]
    templates = [CHAIN_TEMPLATES["add"][1], CHAIN_TEMPLATES["set"][1]]
    sentences = [fill(lead, name="domo86")] + [
        fill(template, actor=e.actor, amount=e.amount, words=words)
        for template, e in zip(templates, links, strict=True)
    ]
    assert read_events(" ".join(["The gull cried.", *sentences])) == links


@pytest.mark.parametrize("words", [False, True], ids=["digits", "words"])
def test_a_correction_replaces_the_amount_of_the_change_just_stated(words):
    said = fill(VARIED_TEMPLATES["take"][1], name="domo86", actor="Mira Holt", amount=19)
    fixed = fill(CORRECTION_TEMPLATE, amount=91, words=words)
    assert read_events(f"{said} {fixed}") == [Event("take", "domo86", 91, None, "Mira Holt")]


def test_a_recount_begun_in_one_item_is_a_set_in_the_next():
    begun = fill(SPLIT_START_TEMPLATE, name="domo86", actor="Mira Holt")
    done = fill(SPLIT_END_TEMPLATE, amount=312, words=True)
    found, left_open = read_story([f"Item 4.\nThe gull cried. {begun}", f"Item 5.\n{done}"])
    assert found == [[], [Event("set", "domo86", 312, None, "Mira Holt")]]
    assert left_open is None
    assert read_story([f"Item 4.\n{begun}"])[1] is not None
    assert read_events(f"Item 5.\n{done}") == []  # its start unseen, the end says nothing
