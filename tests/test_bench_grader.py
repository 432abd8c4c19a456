"""The grader: one meaning, one normal form; scores by question type and by distance."""

from __future__ import annotations

import json

import pytest

from keeper_bench.grader import (
    SIMULATED_READER,
    GradeResult,
    answer_problem,
    answers_match,
    grade,
    normalize_answer,
    parse_answer_lines,
)
from keeper_bench.streams import StreamSpec, generate_stream, question_sets


@pytest.mark.parametrize(
    ("given", "normal"),
    [
        ("332", "332"),
        ("1,204", "1204"),
        ("-5", "-5"),
        ("−5", "-5"),
        ("minus five", "-5"),
        ("three hundred and thirty-two", "332"),
        ("The answer is 332.", "332"),
        ("**332**", "332"),
        ("Protected.", "protected"),
        ("OVERDRAWN", "overdrawn"),
        ("unknown.", "unknown"),
        ("The value is protected.", "protected"),
        ("Mira  Holt.", "mira holt"),
    ],
)
def test_answers_normalise_to_one_form(given, normal):
    assert normalize_answer(given) == normal


def test_actor_names_match_case_insensitively_and_the_clerk_with_or_without_the():
    assert answers_match("Mira Holt", "mira holt")
    assert answers_match("the clerk", "The Clerk.")
    assert answers_match("the clerk", "clerk")
    assert not answers_match("Mira Holt", "Tomas Quill")


def test_a_number_does_not_match_a_different_number_or_a_keyword():
    assert not answers_match("332", "342")
    assert not answers_match("overdrawn", "-5")
    assert not answers_match("protected", "unknown")


def test_numbered_answer_lines_are_read_from_a_chatty_reply():
    reply = "Here you go:\n1. 332\n2) Mira Holt\n**3.** protected\n  4: -5\n5.\nThanks!\n1. 999"
    assert parse_answer_lines(reply) == {1: "332", 2: "Mira Holt", 3: "protected", 4: "-5"}


@pytest.mark.parametrize(
    ("expected", "given", "problem"),
    [
        # negated: what the value is not is not an answer
        ("overdrawn", "57, not overdrawn", "negated"),
        ("overdrawn", "Not overdrawn.", "negated"),
        ("unknown", "It was never recorded, unknown", "negated"),
        ("protected", "It isn't protected: 12", "negated"),
        ("332", "332, no change", "negated"),
        # several values: a list of candidates is not an answer
        ("protected", "12 or protected", "several values"),
        ("332", "332 or 342", "several values"),
        ("332", "332, 342", "several values"),
        ("overdrawn", "overdrawn (-5)", "several values"),
        ("unknown", "protected / unknown", "several values"),
        ("Mira Holt", "Mira Holt or Tomas Quill", "several values"),
        ("Mira Holt", "either Mira Holt", "several values"),
        # hedged: an unsure answer is not an answer
        ("unknown", "I think it's 12, but unknown", "hedged"),
        ("332", "Probably 332.", "hedged"),
        ("332", "maybe 332", "hedged"),
        ("Mira Holt", "I'm not sure, Mira Holt", "hedged"),
        ("protected", "It seems protected", "hedged"),
        ("332", "332, I believe", "hedged"),
    ],
)
def test_hedged_negated_or_multi_valued_answers_are_wrong(expected, given, problem):
    assert answer_problem(given) == problem
    assert not answers_match(expected, given)


@pytest.mark.parametrize(
    ("expected", "given"),
    [
        ("overdrawn", "overdrawn"),
        ("overdrawn", "The value is overdrawn."),
        ("protected", "**Protected**"),
        ("unknown", "unknown."),
        ("332", "332"),
        ("332", "The answer is 332."),
        ("-6", "minus six"),
        ("-6", "−6"),
        ("1204", "1,204"),
        ("58", "58 (= 9 * 5 + 13)"),
        ("Mira Holt", "Mira Holt."),
        ("the clerk", "The clerk"),
    ],
)
def test_an_answer_that_commits_to_one_value_is_graded_on_that_value(expected, given):
    assert answer_problem(given) is None
    assert answers_match(expected, given)


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stream")
    spec = StreamSpec(
        seed=2,
        target_tokens=12_000,
        families=frozenset({"rules", "overdrawn"}),
        question_every=5,
        filler_sentences=(4, 8),
    )
    generate_stream(spec, folder)
    return list(question_sets(folder))


def _perfect_replies(sets):
    return {
        (s["after_item"], s["final"]): "\n".join(
            f"{q['number']}. {q['answer']}" for q in s["questions"]
        )
        for s in sets
    }


def test_true_answers_score_everything_right(sets):
    result = grade(sets, _perfect_replies(sets), reader=SIMULATED_READER)
    assert result.right == result.asked == sum(len(s["questions"]) for s in sets)
    assert sum(asked for _, asked in result.by_category.values()) == result.asked
    assert sum(asked for _, asked in result.by_bucket.values()) == result.asked


def test_a_set_without_a_reply_scores_all_its_questions_wrong(sets):
    replies = _perfect_replies(sets)
    missing = (sets[0]["after_item"], sets[0]["final"])
    del replies[missing]
    result = grade(sets, replies, reader=SIMULATED_READER)
    assert result.asked - result.right == len(sets[0]["questions"])
    assert all(q.given is None for q in result.scored[: len(sets[0]["questions"])])


def test_ignoring_the_overdrawn_rule_loses_exactly_the_overdrawn_questions(sets):
    replies = {}
    for s in sets:
        lines = []
        for q in s["questions"]:
            answer = "-1" if q["category"] == "overdrawn" else q["answer"]
            lines.append(f"{q['number']}. {answer}")
        replies[(s["after_item"], s["final"])] = "\n".join(lines)
    result = grade(sets, replies, reader=SIMULATED_READER)
    right, asked = result.by_category["overdrawn"]
    assert asked > 0 and right == 0
    assert result.asked - result.right == asked


def test_every_table_header_names_the_reader(sets):
    result = grade(sets, {}, reader=SIMULATED_READER, label="notes")
    headers = [
        line for line in result.markdown().splitlines() if line.startswith(("###", "| distance"))
    ]
    assert len(headers) == 2 and all(SIMULATED_READER in h for h in headers)


def test_a_result_survives_json(sets):
    result = grade(sets, _perfect_replies(sets), reader="qwen3-8b", label="rag")
    again = GradeResult.from_json(json.loads(json.dumps(result.to_json())))
    assert again == result


def test_grading_needs_a_reader_label(sets):
    with pytest.raises(ValueError, match="simulated reader"):
        grade(sets, {}, reader=" ")


def test_the_new_question_kinds_are_graded_each_in_its_own_column():
    sets = [
        {
            "after_item": 10,
            "final": False,
            "questions": [
                {"number": 1, "category": "before_last", "bucket": "1–4", "answer": "57"},
                {"number": 2, "category": "count", "bucket": "5–24", "answer": "3"},
                {"number": 3, "category": "order", "bucket": "5–24", "answer": "domo86"},
                {"number": 4, "category": "gist", "bucket": "5–24", "answer": "kibu12"},
                {"number": 5, "category": "gist", "bucket": "5–24", "answer": "kibu12"},
                {"number": 6, "category": "order", "bucket": "5–24", "answer": "domo86"},
            ],
        }
    ]
    reply = "1. 57\n2. three\n3. Domo86\n4. kibu12 or domo86\n5. I think kibu12\n6. kelo12"
    result = grade(sets, {(10, False): reply}, reader=SIMULATED_READER)
    assert result.by_category == {
        "before_last": (1, 1),
        "count": (1, 1),
        "order": (1, 2),
        "gist": (0, 2),
    }
