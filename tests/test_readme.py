"""The quickstart (docs/quickstart.md, the first step the README points to) runs as written
(offline), and the README keeps its two commands."""

from __future__ import annotations

import re
from pathlib import Path

from keeper_middleware import SQLiteArchive

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
QUICKSTART = ROOT / "docs" / "quickstart.md"


def quickstart() -> str:
    return re.findall(r"```python\n(.*?)```", QUICKSTART.read_text(), re.DOTALL)[0]


def test_the_readme_keeps_the_two_commands_and_the_makefile_has_them():
    readme = README.read_text()
    assert "The two commands: `make demo` (set up, then run the main job) and `make test`" in readme
    assert "make docs" in readme and "mkdocs build --strict" in readme
    makefile = (ROOT / "Makefile").read_text()
    for target in ("demo:", "test:", "docs:"):
        assert re.search(rf"^{target}", makefile, re.MULTILINE), target
    assert "mkdocs build --strict" in makefile
    assert README.read_text().count("\n") < 120  # one screen to a first success, then links


def test_the_quickstart_runs_and_prints_what_the_readme_says(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    exec(compile(quickstart(), "docs/quickstart.md", "exec"), {})
    assert capsys.readouterr().out.split() == ["1.", "overdrawn", "2.", "Mira", "Holt"]


def test_the_quickstart_run_twice_continues_its_thread_without_reading_twice(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    archive = tmp_path / "runs" / "quickstart" / "archive.sqlite3"
    answers, stories = [], []
    for _run in range(2):
        exec(compile(quickstart(), "docs/quickstart.md", "exec"), {})
        answers.append(capsys.readouterr().out.split())
        with SQLiteArchive(archive) as opened:
            stories.append(
                [t.content for t in opened.turns("quickstart") if "Item 3." in t.content]
            )
    assert answers == [["1.", "overdrawn", "2.", "Mira", "Holt"]] * 2
    assert len(stories[0]) == len(stories[1]) == 1  # item 3 archived once, not once per run


def test_the_quickstart_shows_the_rule_kept_and_a_search_made(tmp_path, monkeypatch, capsys):
    """What the quickstart says the keeper did around the scripted model, it did."""
    from keeper_middleware.messages.facts import keeper_kind, text_of

    monkeypatch.chdir(tmp_path)
    names: dict[str, object] = {}
    exec(compile(quickstart(), "docs/quickstart.md", "exec"), names)
    capsys.readouterr()
    model, agent = names["model"], names["agent"]
    assert "keeper_bench" not in quickstart()
    assert agent.keeper.counters("quickstart").cuts == 9  # the quickstart says nine
    notes_calls = [c for c in model.received if keeper_kind(c.messages[-1]) == "notes_request"]
    assert notes_calls, "the keeper asked the model for notes"
    last = model.received[-1].messages
    rules = [text_of(m) for m in last if keeper_kind(m) == "rules"]
    assert rules and "overdrawn" in rules[0]  # repeated next to the questions
    searches = [
        call["args"]
        for c in model.received
        for m in c.messages
        for call in getattr(m, "tool_calls", [])
        if call["name"] == "search_archive"
    ]
    assert searches and searches[0] == {"query": "domo03"}
    assert not any("Item 3." in text_of(m) for m in last if keeper_kind(m) is None)
