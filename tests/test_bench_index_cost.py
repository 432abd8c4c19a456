"""``keeper-bench index-cost`` prints its three tables (a step with a cut and searches at a large
archive, keyword and hybrid side by side; many sessions cutting at once) and every session's
passages are indexed by the end."""

from __future__ import annotations

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
    assert "## Search at 300 messages" in text
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
