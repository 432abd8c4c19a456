"""The README's quickstart runs as written (offline)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_quickstart_runs_and_prints_what_the_readme_says(tmp_path, monkeypatch, capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    quickstart = blocks[0]
    monkeypatch.chdir(tmp_path)
    exec(compile(quickstart, "README quickstart", "exec"), {})
    assert capsys.readouterr().out.split() == ["1.", "overdrawn", "2.", "Mira", "Holt"]
