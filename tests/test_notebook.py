"""The comparison notebook runs top to bottom on a tiny stream, in the project's own Python."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "compare_arms.ipynb"


def outputs_text(notebook) -> str:
    parts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            parts.append(output.get("text", ""))
            parts.append(str(output.get("data", {}).get("text/markdown", "")))
    return "\n".join(parts)


@pytest.mark.timeout(240)
def test_the_notebook_compares_arms_and_runs_the_keeper_in_a_hand_built_graph(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("KEEPER_NOTEBOOK_SIZE", "tiny")
    monkeypatch.setenv("KEEPER_NOTEBOOK_OUT", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        notebook, timeout=180, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    )
    client.execute()

    printed = outputs_text(notebook)
    assert f"python: {sys.executable}" in printed  # the kernel is this environment's Python
    assert "### Score by question type (simulated reader)" in printed
    for label in ("rag (keyword)", "rag (hybrid)", "notes (keyword)", "notes_retrieval (keyword)"):
        assert f"| {label} |" in printed
    images = [
        output
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        if "image/png" in output.get("data", {})
    ]
    assert len(images) == 2
    assert "cuts: " in printed and "archived turns: " in printed
    assert (tmp_path / "report.md").exists()
