"""The recall command across several files and conversations: the per-conversation spread."""

import json

import pytest

from keeper_bench.cli import main
from keeper_bench.locomo.dataset import load_locomo
from keeper_bench.locomo.recall import CachedEmbedder, measure
from keeper_bench.locomo.spread import measure_spread, render_spread
from keeper_bench.locomo.vector_cache import load_cached_vectors, save_cached_vectors
from keeper_middleware.retrievers.embedders import HashingEmbedder
from tests.test_locomo import FACTS, sample


@pytest.fixture
def two_files(tmp_path):
    first, second = tmp_path / "dev.json", tmp_path / "tune.json"
    first.write_text(json.dumps([sample("conv-a", FACTS)]))
    second.write_text(json.dumps([sample("conv-b", FACTS[::-1]), sample("conv-c", FACTS[1:])]))
    return first, second


def test_the_spread_pools_to_the_figures_of_all_conversations_at_once(two_files):
    conversations = [c for path in two_files for c in load_locomo(path)]
    spread = measure_spread("keyword", conversations, {}, halves=True)
    assert list(spread.by_conversation) == ["conv-a", "conv-b", "conv-c"]
    whole = measure("keyword", conversations, {})
    assert sum(r.questions for r in spread.pooled) == whole.questions
    assert sum(r.found_any[5] for r in spread.pooled) == whole.found_any[5]
    assert set(spread.half_any5()) == {
        (c, half) for c in ("conv-a", "conv-b", "conv-c") for half in ("even", "odd")
    }


def test_conversations_with_one_sample_id_are_refused(two_files):
    conversations = load_locomo(two_files[0]) * 2
    with pytest.raises(ValueError, match="distinct sample ids"):
        measure_spread("keyword", conversations, {}, halves=False)


def test_the_table_compares_each_method_with_the_first_per_conversation(two_files):
    conversations = [c for path in two_files for c in load_locomo(path)]
    same = measure_spread("keyword", conversations, {}, halves=True)
    table = render_spread([same, same])
    header, _, first, second = table.splitlines()
    assert "conv-a any@5 / all@5" in header and "mean any@5" in header
    assert first.endswith("| 0/3/0 | 0/6/0 |") and second.endswith("| 0/3/0 | 0/6/0 |")


def test_the_recall_command_takes_several_files_and_prints_the_spread(two_files, tmp_path):
    out = tmp_path / "recall.md"
    first, second = two_files
    argv = ["locomo", "recall", "--data", str(first), "--data", str(second)]
    main([*argv, "--halves", "--methods", "keyword,keyword:nostem", "--out", str(out)])
    table = out.read_text()
    assert "3 conversation(s) (conv-a, conv-b, conv-c) from `dev.json, tune.json`" in table
    assert "## Per conversation" in table
    assert "| keyword:nostem | " in table.split("## Per conversation")[1]


def test_vectors_kept_on_disk_are_reused_by_the_next_run(tmp_path):
    embedders: dict = {"hashing": CachedEmbedder(HashingEmbedder())}
    made = embedders["hashing"](["a turn", "another turn"])
    save_cached_vectors(tmp_path, embedders)
    later: dict = {}
    load_cached_vectors(tmp_path, "hashing", later)
    cached = later["hashing"]
    assert cached(["a turn", "another turn"]) == made
    assert cached.hits == 2  # served from the file, not embedded again
