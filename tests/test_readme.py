"""The README's quickstart runs as written (offline)."""

from __future__ import annotations

import re
from pathlib import Path

from keeper_middleware import SQLiteArchive

README = Path(__file__).resolve().parents[1] / "README.md"


def quickstart() -> str:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)[0]


def test_the_quickstart_runs_and_prints_what_the_readme_says(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    exec(compile(quickstart(), "README quickstart", "exec"), {})
    assert capsys.readouterr().out.split() == ["1.", "overdrawn", "2.", "Mira", "Holt"]


def test_the_quickstart_run_twice_continues_its_thread_without_reading_twice(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    archive = tmp_path / "runs" / "quickstart" / "archive.sqlite3"
    answers, stories = [], []
    for _run in range(2):
        exec(compile(quickstart(), "README quickstart", "exec"), {})
        answers.append(capsys.readouterr().out.split())
        with SQLiteArchive(archive) as opened:
            stories.append(
                [t.content for t in opened.turns("quickstart") if "Item 3." in t.content]
            )
    assert answers == [["1.", "overdrawn", "2.", "Mira", "Holt"]] * 2
    assert len(stories[0]) == len(stories[1]) == 1  # item 3 archived once, not once per run
