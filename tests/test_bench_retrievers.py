"""The retrievers benchmark: an index built once with --keep is searched again without adding."""

import pytest

from keeper_bench import retrievers_bench
from keeper_middleware.retrievers.embedders import HashingEmbedder, embed_query


@pytest.mark.parametrize("backend", ["keyword", "embedding"])
def test_a_kept_index_is_built_once_and_then_only_searched(tmp_path, backend):
    kept = tmp_path / "indexes"
    command = [
        "--sizes", "300", "--backends", backend, "--queries", "questions",
        "--per-passage", "3", "--embedder", "hashing", "--keep", str(kept),
    ]  # fmt: skip
    first, second = tmp_path / "first.md", tmp_path / "second.md"
    retrievers_bench.main([*command, "--output", str(first)])
    retrievers_bench.main([*command, "--output", str(second)])
    (folder,) = kept.iterdir()
    assert (folder / "built").exists()
    first_row = next(
        line for line in first.read_text().splitlines() if line.startswith(f"| {backend}")
    )
    second_row = next(
        line for line in second.read_text().splitlines() if line.startswith(f"| {backend}")
    )
    assert "built before" not in first_row
    assert "built before" in second_row
    assert "| 1000 |" in second_row  # the same 1,000 questions were asked of the kept index


def test_queries_can_be_embedded_by_another_model_than_the_index():
    index, query = HashingEmbedder(dim=64), HashingEmbedder(dim=128)
    split = retrievers_bench.QueryModelEmbedder(index, query)
    assert split.name == index.name  # the collection records the index's embedder
    assert split(["domo86 at nine"]) == index(["domo86 at nine"])
    assert embed_query(split, "domo86?") == query(["domo86?"])[0]
