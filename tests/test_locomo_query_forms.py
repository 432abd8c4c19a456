"""The recall command's query-form, vector-form and fusion options (measured levers)."""

import json

import pytest

from keeper_bench.locomo.dataset import load_locomo
from keeper_bench.locomo.query_forms import strip_scaffolding, without_names
from keeper_bench.locomo.recall import MethodSpec, configuration, measure
from tests.test_locomo import FACTS, sample


def test_a_question_loses_its_scaffolding_and_keeps_its_subject():
    assert strip_scaffolding("When did Caroline go to the support group?") == (
        "Caroline go to the support group"
    )
    assert strip_scaffolding("What kind of art does Mel make?") == "art does Mel make"
    assert strip_scaffolding("How many times has Mel gone to the beach?") == (
        "times has Mel gone to the beach"
    )
    assert strip_scaffolding("Why?") == "Why?"  # nothing would be left


def test_a_question_without_its_names_keeps_the_rest():
    assert without_names("What is Caroline's identity?", ["Caroline"]) == "What is identity?"
    assert without_names("Did Mel and Caroline meet?", ["Caroline", "Mel"]) == "Did and meet?"
    assert without_names("Caroline?", ["Caroline"]) == "Caroline?"


@pytest.mark.parametrize(
    ("method", "said"),
    [
        ("embedding:hashing:mq", "embedding query form `mq`"),
        ("embedding:hashing:qstrip", "embedding query form `qstrip`"),
        ("embedding:hashing:msum=0.5", "best sentence + 0.5 × itself"),
        ("hybrid:hashing:vt=short", "vectors embed the `short` text"),
        ("hybrid:hashing:fuse=score", "fusion: scaled scores"),
    ],
)
def test_each_option_runs_and_says_what_it_ran_with(tmp_path, method, said):
    path = tmp_path / "locomo-fixture.json"
    path.write_text(json.dumps([sample("conv-a", FACTS)]))
    result = measure(method, load_locomo(path), {})
    assert result.questions > 0 and result.rate(10) > 0.0
    assert said in configuration(MethodSpec.parse(method))
