"""The comparison notebook runs top to bottom on a tiny stream, in the project's own Python, and
shows what the run folders hold: the recorded comparison verbatim, the live matrix's summary as
the graded runs give it, and a hand-built graph whose printed score is its answers' grade."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

import keeper_bench as bench
from keeper_bench.grader import SIMULATED_READER, grade
from keeper_bench.matrix import MatrixSpec, run_matrix
from keeper_bench.streams import question_sets

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "compare_arms.ipynb"
RECORDED = [
    Path(bench.__file__).parents[1] / "results" / f"matrix_{size}" for size in ("240k", "1m")
]
SELF_EDIT = Path(bench.__file__).parents[1] / "results" / "self_edit_arms"
LIVE_ARMS = ("notes", "summarize", "peer_langchain_summarization_tuned", "self_edit_rules")
PNG = b"\x89PNG"


def outputs(notebook, kind: str) -> list[str]:
    found = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if kind == "text" and "text" in output:
                found.append(output["text"])
            elif kind in output.get("data", {}):
                found.append(output["data"][kind])
    return found


@pytest.mark.timeout(300)
def test_the_notebook_shows_the_recorded_and_the_live_comparison_as_the_runs_grade_them(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("KEEPER_NOTEBOOK_SIZE", "tiny")
    monkeypatch.setenv("KEEPER_NOTEBOOK_SEEDS", "1")
    monkeypatch.setenv("KEEPER_NOTEBOOK_ARMS", ",".join(LIVE_ARMS))
    monkeypatch.setenv("KEEPER_NOTEBOOK_OUT", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        notebook, timeout=240, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    )
    client.execute()

    printed = "\n".join(outputs(notebook, "text"))
    markdown = outputs(notebook, "text/markdown")
    assert f"python: {sys.executable}" in printed  # the kernel is this environment's Python

    # part 1: the recorded comparison, exactly as bench/results holds it
    for recorded in RECORDED:
        assert (recorded / "README.md").read_text() in markdown
    # the self-editing arms: each graph drawn, and their recorded comparison
    assert (SELF_EDIT / "README.md").read_text() in markdown
    for name in ("self_edit", "self_edit_archive", "self_edit_rules", "free_notes"):
        assert f"{name}: " in printed
    assert printed.count("tools --> context;") == 4

    # part 2: the live summary is what the run folders grade to (read back, not run again)
    spec = MatrixSpec(arms=LIVE_ARMS, sizes=("tiny",), seeds=(1,), window=3072)
    _, summary = run_matrix(spec, tmp_path / "matrix", progress=False)
    assert summary in markdown
    assert "| arm | no faults | realistic faults |" in summary

    images = [base64.b64decode(png) for png in outputs(notebook, "image/png")]
    live_plots = sorted((tmp_path / "matrix").glob("*.png"))
    recorded_plots = [*(p for r in RECORDED for p in r.glob("*.png")), *SELF_EDIT.glob("*.png")]
    assert len(images) == len(recorded_plots) + len(live_plots) >= 4
    assert all(image.startswith(PNG) for image in images)

    # part 3: the hand-built graph's printed score is its saved answers' grade
    saved = json.loads((tmp_path / "hand_built_answers.json").read_text())
    stream = tmp_path / "matrix" / "streams" / "tiny-seed1"
    result = grade(
        question_sets(stream), {(a, f): reply for a, f, reply in saved}, reader=SIMULATED_READER
    )
    assert f"hand-built graph: {result.right}/{result.asked} right (simulated reader)" in printed
    assert result.asked > 0 and result.right >= 0.9 * result.asked


def test_the_committed_notebook_shows_the_small_comparison_without_running_anything():
    """``make notebook`` ran it top to bottom at the small size and kept what it showed: a reader
    on GitHub sees the tables and the plots; no cell failed and no machine's path is in it."""
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1))
    assert all(cell.outputs for cell in code)
    assert not any(o.output_type == "error" for cell in code for o in cell.outputs)
    markdown = "\n".join(outputs(notebook, "text/markdown"))
    printed = "\n".join(outputs(notebook, "text"))
    assert "Streams `rules+overdrawn` at small, seeds 1, 2" in markdown
    assert "| arm | no faults | realistic faults |" in markdown
    from keeper_bench.arms import ARMS

    for arm in ARMS:  # every arm's live row
        assert f"| {arm} |" in markdown, arm
    assert "hand-built graph: " in printed and "(simulated reader)" in printed
    images = [base64.b64decode(png) for png in outputs(notebook, "image/png")]
    assert len(images) >= 8 and all(image.startswith(PNG) for image in images)
    root = str(Path(__file__).resolve().parents[1])
    assert root not in NOTEBOOK.read_text(), "refresh with make notebook (it scrubs the path)"
