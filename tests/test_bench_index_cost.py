"""``keeper-bench index-cost`` prints its three tables (a step with a cut and searches at a large
archive, keyword and hybrid side by side; many sessions cutting at once) and every session's
passages are indexed by the end."""

from __future__ import annotations

import pytest

from keeper_bench.cli import main


def test_index_cost_prints_steps_searches_and_many_sessions(tmp_path, capsys):
    out = tmp_path / "index_cost.md"
    argv = ["index-cost", "--messages", "300", "--steps", "2", "--think", "0", "--searches", "5"]
    argv += ["--sessions", "2", "--duration", "1", "--embedder", "hashing", "--out", str(out)]
    assert main(argv) == 0
    text = out.read_text()
    assert "archive of 300 messages written" in text
    assert "## A step with a cut at 300 archived messages" in text
    assert "| keyword |" in text and "| hybrid |" in text
    assert "## Search at 300 messages of chat words" in text
    assert "## 2 sessions cutting at once" in text
    row = text.strip().splitlines()[-1].split("|")
    archived, indexed = (int(cell.replace(",", "")) for cell in row[3:5])
    assert archived > 0 and indexed > 0
    assert "load" in text


def test_index_cost_measures_the_keyword_retriever_alone_without_building_vectors(tmp_path, capsys):
    keep = tmp_path / "keep"
    argv = ["index-cost", "--messages", "200", "--steps", "1", "--think", "0", "--searches", "3"]
    argv += ["--retrievers", "keyword", "--k", "10,200,tool", "--skip", "sessions"]
    argv += ["--embedder", "hashing", "--keep", str(keep)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "indexed (keyword) in" in text
    assert "| keyword |" in text and "| hybrid |" not in text
    assert "k=10," in text and "k=200," in text and "the search tool's search," in text
    assert not (keep / "archive.index" / "chroma").exists()


def test_zipf_words_are_mostly_rare_as_natural_text_is():
    import random
    from collections import Counter

    from keeper_bench.zipf_words import vocabulary, zipf_words

    assert len(set(vocabulary())) == len(vocabulary()) == 50_000
    counts = Counter(zipf_words(random.Random(1), 60_000))
    first, second = (counts[word] for word in vocabulary()[:2])
    assert first > 1.8 * second  # rank 1 about twice rank 2
    assert len(counts) > 10_000  # a long tail
    assert sum(1 for c in counts.values() if c == 1) > len(counts) / 3


def test_index_cost_builds_and_searches_an_archive_of_zipf_words(tmp_path, capsys):
    keep = tmp_path / "keep"
    argv = ["index-cost", "--messages", "300", "--searches", "3", "--retrievers", "keyword"]
    argv += ["--skip", "steps,sessions", "--vocabulary", "zipf", "--keep", str(keep)]
    assert main(argv) == 0
    assert "## Search at 300 messages of zipf words" in capsys.readouterr().out
    assert (keep / "built-300-keyword-zipf").exists()
    with pytest.raises(SystemExit, match="another size or vocabulary"):
        main([*argv[:-4], "--vocabulary", "chat", "--keep", str(keep)])


def test_index_cost_measures_fts5_and_tantivy_side_by_side_on_one_archive(tmp_path, capsys):
    keep = tmp_path / "keep"
    argv = ["index-cost", "--messages", "300", "--searches", "3", "--retrievers", "keyword"]
    argv += ["--skip", "steps,sessions", "--k", "10,tool", "--keep", str(keep)]
    assert main([*argv, "--engines", "fts5,tantivy"]) == 0
    text = capsys.readouterr().out
    assert "tantivy index of 300 passages built in" in text
    assert "| keyword |" in text and "| keyword (tantivy) |" in text
    assert main([*argv, "--engines", "tantivy"]) == 0  # the archive and both indexes are reused
    again = capsys.readouterr().out
    assert "written" not in again and "built in" not in again
    assert "| keyword (tantivy) |" in again and "| keyword |" not in again


def test_index_cost_builds_no_fts5_index_for_tantivy_alone_in_the_commits_asked(tmp_path, capsys):
    from keeper_middleware.retrievers.tantivy_keyword import TantivyKeywordRetriever

    keep = tmp_path / "keep"
    argv = ["index-cost", "--messages", "200", "--searches", "2", "--engines", "tantivy"]
    argv += ["--batch", "64", "--retrievers", "keyword", "--skip", "steps,sessions"]
    assert main([*argv, "--keep", str(keep)]) == 0
    said = capsys.readouterr().out
    assert "| keyword (tantivy) |" in said and "64 a commit" in said
    assert not (keep / "archive.index" / "keyword.sqlite3").exists()
    index = TantivyKeywordRetriever(keep / "archive.index" / "tantivy")
    assert index.count("big") == 200
    index.close()


def test_a_tantivy_build_tells_the_archive_so_a_keeper_does_not_index_it_again(tmp_path):
    from keeper_bench.index_builds import build_tantivy, write_archive
    from keeper_middleware.archive.store import open_archive
    from keeper_middleware.search.indexing import INDEXED_SEQ, NEXT_POSITION

    path = tmp_path / "archive.sqlite3"
    write_archive(path, 150, "chat", say=print)
    build_tantivy(path, say=print, batch=64)
    archive = open_archive(path)
    turns = list(archive.turns("big", after_seq=-1))
    assert archive.get_value("big", NEXT_POSITION) == 150
    assert archive.get_value("big", INDEXED_SEQ) == turns[-1].seq
    first, last = turns[0].seq, turns[-1].seq
    assert archive.positions("big", [first, last]) == {first: 0, last: 149}
    archive.close()


def test_index_cost_builds_the_hybrids_vectors_in_slices_beside_tantivy_alone(
    tmp_path, capsys, monkeypatch
):
    from keeper_bench import index_builds

    monkeypatch.setattr(index_builds, "BULK_SLICE", 64)
    keep = tmp_path / "keep"
    argv = ["index-cost", "--messages", "200", "--searches", "2", "--engines", "tantivy"]
    argv += ["--retrievers", "hybrid", "--skip", "steps,sessions", "--embedder", "hashing"]
    argv += ["--k", "10,tool", "--keep", str(keep)]
    assert main(argv) == 0
    said = capsys.readouterr().out
    slices = [line for line in said.splitlines() if line.startswith("  indexed ")]
    assert [line.split(" passages")[0].split()[-1] for line in slices] == [
        "64",
        "128",
        "192",
        "200",
    ]
    assert "indexed (vectors made by hashing) in" in said
    assert "| hybrid (tantivy) |" in said and "process CPU p50 / p95 (ms)" in said
    assert not (keep / "archive.index" / "keyword.sqlite3").exists()
    assert main(argv) == 0  # built once: the second run only searches
    assert "indexed" not in capsys.readouterr().out
