"""The recall levers' benchmark options: ``--halves`` and the date context (``when``)."""

import json

import pytest

from keeper_bench.cli import main
from keeper_bench.locomo.dataset import load_locomo
from keeper_bench.locomo.recall import MethodSpec, configuration, measure, measure_halves
from keeper_bench.locomo.speakers import named_times
from tests.test_locomo import FACTS, sample

CAMPING = [
    # (session date, text): the June turn, planning July, matches the question's words better;
    # the question asks about the trip made in July, which only the date context tells
    ("1:00 pm on 3 June, 2023", "Camping by the lake again! Lake camping in July is booked."),
    ("1:00 pm on 8 July, 2023", "We went camping by the lake, the kids loved it."),
]


def dated_sample() -> dict:
    conversation: dict = {"speaker_a": "Ana", "speaker_b": "Ben"}
    for number, (date, text) in enumerate(CAMPING, start=1):
        conversation[f"session_{number}_date_time"] = date
        conversation[f"session_{number}"] = [
            {"speaker": "Ben", "dia_id": f"D{number}:1", "text": "What did you do lately?"},
            {"speaker": "Ana", "dia_id": f"D{number}:2", "text": text},
        ]
    qa = [
        {
            "question": "Where did Ana go camping by the lake in July?",
            "answer": "July 2023",
            "evidence": ["D2:2"],
            "category": 2,
        }
    ]
    return {"sample_id": "conv-dated", "conversation": conversation, "qa": qa}


@pytest.fixture
def facts_file(tmp_path):
    path = tmp_path / "locomo-fixture.json"
    path.write_text(json.dumps([sample("conv-a", FACTS), sample("conv-b", FACTS[::-1])]))
    return path


@pytest.fixture
def dated_file(tmp_path):
    path = tmp_path / "locomo-dated.json"
    path.write_text(json.dumps([dated_sample()]))
    return path


def test_the_halves_split_the_questions_and_add_up_to_the_whole(facts_file):
    conversations = load_locomo(facts_file)
    whole = measure("keyword", conversations, {})
    even, odd = measure_halves("keyword", conversations, {})
    assert (even.method, odd.method) == ("keyword [even]", "keyword [odd]")
    assert even.questions + odd.questions == whole.questions
    assert abs(even.questions - odd.questions) <= len(conversations)
    for k in (1, 5, 10):
        assert even.found_any[k] + odd.found_any[k] == whole.found_any[k]
        assert even.found_all[k] + odd.found_all[k] == whole.found_all[k]


def test_the_recall_command_prints_both_halves_and_each_configuration_once(
    facts_file, tmp_path, capsys
):
    out = tmp_path / "recall.md"
    main(
        [
            "locomo",
            "recall",
            "--data",
            str(facts_file),
            "--halves",
            "--methods",
            "keyword,keyword:when",
            "--out",
            str(out),
        ]
    )
    table = out.read_text()
    for row in ("keyword [even]", "keyword [odd]", "keyword:when [even]", "keyword:when [odd]"):
        assert f"| {row} |" in table
    assert table.count("- `keyword:when`: ") == 1
    assert "keyword:when [odd]" in capsys.readouterr().out


def test_a_question_names_months_and_years():
    assert named_times("What did Mel paint in July 2023?") == {"July", "2023"}
    assert named_times("Caroline (1:56 pm on 8 May, 2023), item 3") == {"May", "2023"}
    assert named_times("What did Ana paint last week?") == set()


@pytest.mark.parametrize(
    "method", ["keyword:nonames", "embedding:hashing:nodates", "hybrid:hashing:nonames:nodates"]
)
def test_when_lifts_the_turn_dated_in_the_month_the_question_names(dated_file, method):
    conversations = load_locomo(dated_file)
    assert measure(method, conversations, {}).rate(1) == 0.0
    assert measure(f"{method}:when", conversations, {}).rate(1) == 1.0


@pytest.mark.parametrize("method", ["keyword", "embedding:hashing", "hybrid:hashing"])
def test_every_backend_matches_the_named_month_by_default(dated_file, method):
    conversations = load_locomo(dated_file)
    assert measure(method, conversations, {}).rate(1) == 1.0
    assert "named speakers and dates" in configuration(MethodSpec.parse("keyword"))
    assert "no name matching" in configuration(MethodSpec.parse("keyword:nonames"))
    assert "dated in the named months/years" in configuration(MethodSpec.parse("hybrid:when"))
