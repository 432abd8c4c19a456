"""The documentation as printed: every python block of the README and the guides runs offline
(a block that cannot is marked a fragment, and there are few), every link resolves, and the
site builds with ``mkdocs build --strict`` (a broken link, a missing page or a docstring the
API reference cannot read fails it)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md"]
FENCE = re.compile(r"^```python([^\n]*)\n(.*?)^```", re.DOTALL | re.MULTILINE)
FRAGMENT = re.compile(r'^ title="a fragment: [^"]+"$')
"""A block that cannot run as printed (it needs a server, a database, or names from the text
around it) says so in its fence: ```python title="a fragment: what it needs"```."""
MOST_FRAGMENTS = 6


def python_blocks(page: Path) -> list[tuple[str, str]]:
    """(fence info after ``python``, code) of each python block on ``page``."""
    return FENCE.findall(page.read_text())


def runnable_blocks() -> list[object]:
    found = []
    for page in PAGES:
        for n, (info, code) in enumerate(python_blocks(page)):
            if not info.strip():
                where = f"{page.relative_to(ROOT)}#{n + 1}"
                found.append(pytest.param(where, code, id=where))
    return found


def promised_output(code: str) -> list[str] | None:
    """The words the block's last ``print(...)  # words`` line promises, if it promises any."""
    printed = re.findall(r"^print\(.*\)\s+#\s*(.+)$", code, re.MULTILINE)
    return printed[-1].split() if printed else None


@pytest.mark.parametrize(("where", "code"), runnable_blocks())
def test_each_python_block_runs_as_printed(where, code, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    scope: dict[str, object] = {"__name__": "__main__"}
    exec(compile(code, where, "exec"), scope)
    out = capsys.readouterr().out
    promised = promised_output(code)
    if promised is not None:
        assert out.split() == promised, f"{where} printed {out!r}"
    keeper = getattr(scope.get("node"), "keeper", None) or scope.get("keeper")
    close = getattr(keeper, "close", None)
    if callable(close):
        close()


def test_the_readme_shows_the_middleware_the_node_and_the_proxy_lines_and_they_run():
    readme = (ROOT / "README.md").read_text()
    codes = [code for info, code in python_blocks(ROOT / "README.md") if not info.strip()]
    assert any("middleware=[KeeperMiddleware(" in code for code in codes)
    assert any('add_node("keeper", node.as_runnable())' in code for code in codes)
    assert "keeper-proxy --upstream http://" in readme
    for code in codes:  # complete: a model, its imports, and for the graph its edges
        assert "ScriptedChatModel(" in code and "import" in code
    graph = next(code for code in codes if "StateGraph" in code)
    assert "add_edge(START" in graph and "add_conditional_edges" in graph and "ToolNode" in graph


def test_fragments_are_marked_say_what_they_need_and_are_few():
    infos = [info for page in PAGES for info, _code in python_blocks(page) if info.strip()]
    assert all(FRAGMENT.match(info) for info in infos), infos
    assert len(infos) <= MOST_FRAGMENTS
    assert not any(info.strip() for info, _ in python_blocks(ROOT / "README.md"))


@pytest.mark.parametrize(
    "page", [ROOT / "README.md", ROOT / "bench" / "README.md"], ids=["README", "bench"]
)
def test_every_relative_link_of_the_readmes_names_a_file_that_exists(page):
    """The site checks its own pages' links; the two READMEs live outside it."""
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text())
    relative = [link for link in links if "://" not in link]
    assert relative
    missing = [link for link in relative if not (page.parent / link).exists()]
    assert missing == []


def test_the_benchmark_distribution_carries_the_measured_figures_as_its_readme():
    bench = (ROOT / "bench" / "pyproject.toml").read_text()
    assert re.search(r'^readme = "README.md"$', bench, re.MULTILINE)
    figures = (ROOT / "bench" / "README.md").read_text()
    assert "simulated reader" in figures  # never presented as a language model's score
    assert "| notes (the keeper) |" in figures and "keeper-bench matrix" in figures
    assert "## Measured" in figures and "## Measured" not in (ROOT / "README.md").read_text()


@pytest.mark.slow
def test_the_site_builds_strictly_with_no_warning(tmp_path):
    """``make docs``: mkdocs-material with the API reference rendered from the docstrings."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    assert "WARNING" not in built.stderr
    reference = (tmp_path / "api" / "keeper" / "index.html").read_text()
    assert 'id="keeper_middleware.keeper.Keeper"' in reference
    assert (tmp_path / "quickstart" / "index.html").exists()
