"""Run a notebook top to bottom in place, so it is committed with its outputs (``make notebook``).

The kernel runs from the repository root, so the notebook's relative paths (``runs/notebook``)
land where they would for a reader; the checkout's own path is taken out of the outputs, so the
committed notebook shows the same text on every machine.

    python scripts/refresh_notebook.py examples/compare_arms.ipynb [--timeout 3600]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


def scrub(node: object, root: str) -> object:
    """``node`` (an output, as JSON) with ``root/`` taken out of every string in it."""
    if isinstance(node, str):
        return node.replace(root + "/", "")
    if isinstance(node, list):
        return [scrub(item, root) for item in node]
    if isinstance(node, dict):
        return {key: scrub(value, root) for key, value in node.items()}
    return node


def refresh(path: Path, timeout: int) -> float:
    """Execute ``path`` in place; returns the seconds it took."""
    notebook = nbformat.read(path, as_version=4)
    started = time.perf_counter()
    NotebookClient(
        notebook, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": ROOT}}
    ).execute()
    seconds = time.perf_counter() - started
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs = [
                nbformat.from_dict(scrub(json.loads(json.dumps(o)), str(ROOT)))
                for o in cell.outputs
            ]
            cell.metadata.pop("execution", None)
    nbformat.write(notebook, path)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per cell")
    args = parser.parse_args(argv)
    seconds = refresh(args.notebook.resolve(), args.timeout)
    print(f"{args.notebook}: run in place in {seconds:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
