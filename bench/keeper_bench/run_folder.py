"""The run folder's small files: run.json, progress.json and the JSON-lines logs.

Kept apart from the run loop (``runner.py``) because this is what makes a run resumable: every
file is written so that a kill at any moment leaves it readable (whole-file writes go through a
temporary file and a rename, a line torn by a kill is dropped on the next read), and an existing
folder is checked against the run asked for before anything is added to it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from keeper_bench.audit import MemoryVersion
from keeper_bench.costs import CallRecord
from keeper_bench.run_options import RunOptions

PROGRESS_FILE = "progress.json"


def write_json_atomic(path: Path, data: Any) -> None:
    """Replace ``path`` whole: a kill leaves the old file or the new one, never half of one."""
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(temporary, path)


def complete_lines(path: Path) -> list[str]:
    """The complete JSON lines of a file; a line torn by a kill is dropped (and the file fixed)."""
    if not path.exists():
        return []
    raw = path.read_text(encoding="utf-8")
    lines = raw.split("\n")
    kept = [line for line in lines[:-1] if line.strip()]
    if lines[-1].strip():  # no newline after it: written only in part
        path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    return kept


class SummaryLog:
    """Saves each summary a summarising arm writes as a numbered version (for the audit)."""

    def __init__(self, path: Path) -> None:
        self.append = JsonlAppender(path)
        self.count = len(complete_lines(path))

    def __call__(self, last_item: int, text: str) -> None:
        self.count += 1
        version = MemoryVersion(self.count, 1, last_item, text, kind="summary")
        self.append(version.to_json())


class JsonlAppender:
    """Appends one JSON line per record, flushed at once (a kill loses at most a torn line)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, record: Mapping[str, Any]) -> None:
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            handle.flush()


_BEFORE_KEY: dict[str, Any] = {"rot": 0.0}
"""Identity keys added later, and the value a run.json written before them means."""


def prepare_run_dir(options: RunOptions, run_dir: Path) -> dict[str, Any]:
    """Write run.json, or check that an existing one describes the same run (then resume)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    wanted = options.run_json(run_dir)
    path = run_dir / "run.json"
    if path.exists():
        existing = json.loads(path.read_text(encoding="utf-8"))
        differing = sorted(
            k
            for k in wanted
            if k in options.identity_keys() and existing.get(k, _BEFORE_KEY.get(k)) != wanted[k]
        )
        if differing:
            raise ValueError(
                f"{run_dir} holds a different run (it differs in {', '.join(differing)}); "
                "choose another --out folder, or delete that one to start again"
            )
        return dict(existing)
    write_json_atomic(path, wanted)
    return wanted


def read_progress(run_dir: Path) -> dict[str, Any]:
    """How far an earlier process got: steps done, batches served in the current step."""
    path = run_dir / PROGRESS_FILE
    if not path.exists():
        return {"steps_done": 0, "served": {}, "finished": False}
    return dict(json.loads(path.read_text(encoding="utf-8")))


def read_calls(run_dir: Path) -> list[CallRecord]:
    """The model calls a run recorded, in order (a torn last line is dropped)."""
    return [
        CallRecord.from_json(json.loads(line)) for line in complete_lines(run_dir / "calls.jsonl")
    ]
