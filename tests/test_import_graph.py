"""The package's import graph has no cycle, and its layers import only what docs/architecture.md
allows.

The graph is read from the source (ast), not by importing: every ``import`` a module runs, at
module level or deferred inside a function (a deferred import that closes a loop is still a loop,
only a later one), except those under ``if TYPE_CHECKING:``. An edge goes to the module named, or
to the package when the name is something the package holds.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "keeper_middleware"


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name, through the symlinked folders."""
    found: dict[str, Path] = {}
    base = ROOT / PACKAGE
    for folder, _dirs, files in os.walk(base, followlinks=True):
        relative = Path(folder).relative_to(base).parts
        if "__pycache__" in relative:
            continue
        for file in files:
            if not file.endswith(".py"):
                continue
            parts = [PACKAGE, *relative]
            if file != "__init__.py":
                parts.append(file[:-3])
            found[".".join(parts)] = Path(folder) / file
    return found


MODULES = _modules()


def _run_time_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    for statement in body:
        if isinstance(statement, ast.If) and "TYPE_CHECKING" in ast.unparse(statement.test):
            yield from _run_time_statements(statement.orelse)
            continue
        yield statement
        for field in ("body", "orelse", "finalbody", "handlers"):
            inner = getattr(statement, field, None)
            if isinstance(inner, list):
                for item in inner:
                    if isinstance(item, ast.ExceptHandler):
                        yield from _run_time_statements(item.body)
                yield from _run_time_statements([s for s in inner if isinstance(s, ast.stmt)])


def _known(name: str) -> str | None:
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str) -> set[str]:
    """The package's modules ``module`` imports when it runs."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for statement in _run_time_statements(ast.parse(path.read_text()).body):
        names: list[str] = []
        if isinstance(statement, ast.Import):
            names = [alias.name for alias in statement.names]
        elif isinstance(statement, ast.ImportFrom):
            if statement.level:
                parts = package.split(".")[: len(package.split(".")) - statement.level + 1]
                source = ".".join([*parts, *([statement.module] if statement.module else [])])
            else:
                source = statement.module or ""
            names = [
                f"{source}.{a.name}" if f"{source}.{a.name}" in MODULES else source
                for a in statement.names
            ]
        for name in names:
            target = _known(name)
            if target is not None and target != module:
                found.add(target)
                found |= _packages_run_first(target, module)
    return found


def _packages_run_first(target: str, importer: str) -> set[str]:
    """The packages whose ``__init__`` runs before ``target`` does: importing
    ``keeper_middleware.archive.sqlite.archive`` runs ``archive/__init__.py`` and
    ``archive/sqlite/__init__.py`` first, so a loop through a package's ``__init__`` is a loop.
    The root package and the importer's own packages (already running) are left out."""
    parts = target.split(".")
    packages = {".".join(parts[:i]) for i in range(2, len(parts))}
    return {p for p in packages if p in MODULES and not importer.startswith(p + ".")}


GRAPH = {module: imports_of(module) for module in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def test_the_walk_sees_every_folder_and_the_imports_it_should():
    assert {"keeper_middleware.retrievers.base", "keeper_middleware.graphs.rag"} <= MODULES.keys()
    assert "keeper_middleware.integrations.proxy.app" in MODULES
    assert "keeper_middleware.errors" in GRAPH["keeper_middleware.retrievers.base"]
    # deferred imports count: open_archive picks its backend inside the function
    assert "keeper_middleware.archive.sqlite" in GRAPH["keeper_middleware.archive.store"]


def test_importing_a_module_counts_its_packages_inits():
    # the keyword index reads SQLite faults from the errors' room, whose __init__ runs first
    assert "keeper_middleware.errors" in GRAPH["keeper_middleware.retrievers.keyword"]
    assert _packages_run_first("keeper_middleware.archive.sqlite.archive", "x") == {
        "keeper_middleware.archive",
        "keeper_middleware.archive.sqlite",
    }


def test_the_cycle_finder_finds_a_loop_through_three_modules():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_package_has_no_import_cycle():
    assert _cycles(GRAPH) == []


def test_errors_is_the_bottom_layer():
    assert GRAPH["keeper_middleware.errors"] == set()


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


BELOW_THE_RETRIEVERS = {"keeper_middleware.errors", "keeper_middleware.errors.sqlite"}
"""What a retriever may import from the rest of the package: the errors, and how a SQLite file's
failures are read (the keyword index is a SQLite file too); both import only the errors."""


def test_the_retrievers_import_only_their_own_modules_and_the_bottom_layer():
    for module, targets in GRAPH.items():
        if _room(module) != "retrievers":
            continue
        outside = {t for t in targets if _room(t) != "retrievers"}
        assert outside <= BELOW_THE_RETRIEVERS, (module, outside)
    for module in BELOW_THE_RETRIEVERS - {"keeper_middleware.errors"}:
        assert GRAPH[module] <= {"keeper_middleware.errors"}, module


BENCHMARK = "keeper_bench"
"""The benchmark's package: its own distribution (bench/), which users do not install."""


def benchmark_imports(path: Path) -> list[str]:
    """Every name of the benchmark a source file imports, wherever the import is (under
    ``if TYPE_CHECKING:`` too: the product's wheel must not even name it)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == BENCHMARK]
        elif (
            isinstance(node, ast.ImportFrom)
            and not node.level
            and (node.module or "").split(".")[0] == BENCHMARK
        ):
            found.append(str(node.module))
    return found


def test_the_benchmark_check_sees_every_form_of_import(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "import keeper_bench.cli\n"
        "def f():\n    from keeper_bench.arms import build_arm\n"
        "if TYPE_CHECKING:\n    from keeper_bench import runner\n"
    )
    assert benchmark_imports(source) == ["keeper_bench.cli", "keeper_bench.arms", "keeper_bench"]


def test_nothing_in_the_product_imports_the_benchmark():
    assert not any(m.split(".")[1:2] == ["bench"] for m in MODULES), (
        "a bench package is back inside keeper_middleware/"
    )
    offenders = {m: benchmark_imports(p) for m, p in MODULES.items()}
    assert {m: found for m, found in offenders.items() if found} == {}


BOTTOM_ROOMS = {"errors", "messages", "tokens", "retrievers", "testing"}
"""Rooms every other room may use and that use no room above them (docs/architecture.md): the
errors, what a message is, how tokens are counted, how passages are ranked, the scripted model."""


def test_the_bottom_rooms_import_nothing_above_them():
    for module, targets in GRAPH.items():
        if _room(module) not in BOTTOM_ROOMS:
            continue
        outside = {_room(t) for t in targets} - BOTTOM_ROOMS
        assert not outside, (module, outside)


PROXY = "keeper_middleware.integrations.proxy"
PROXY_TOP = {"__init__", "__main__", "app", "cli", "demo", "serving"}
"""The proxy's server, at the top of its package: the app, the command, the socket, the demo."""
PROXY_ROOMS = {
    "conversation": set(),
    "chat_completions": {"conversation"},
    "responses": {"conversation"},
    "messages": {"conversation"},
    "upstream": {"conversation", "chat_completions", "responses", "messages"},
    "slots": set(),
    "sessions": {"conversation", "chat_completions", "upstream", "slots"},
    "doors": {
        "conversation",
        "chat_completions",
        "responses",
        "messages",
        "upstream",
        "sessions",
    },
}
"""Which of the proxy's rooms each may import (docs/architecture.md, the proxy's map): the one
conversation form at the bottom; each API's room on it alone, never another API's; the upstream
side over the APIs; the session engine over the upstream, knowing no API but the form and Chat
Completions; the Responses and Messages doors over the engine; the server above them all."""


def _proxy_room(module: str) -> str:
    """The room of a proxy module (``(top)`` for the server's modules)."""
    rest = module.removeprefix(PROXY + ".").split(".")
    return rest[0] if len(rest) > 1 or MODULES[module].name == "__init__.py" else "(top)"


def test_the_proxy_keeps_each_concern_in_its_room_and_only_the_server_at_the_top():
    proxy = [m for m in MODULES if m.startswith(PROXY + ".")]
    assert {m.removeprefix(PROXY + ".") for m in proxy if _proxy_room(m) == "(top)"} == (
        PROXY_TOP - {"__init__"}
    )
    assert {_proxy_room(m) for m in proxy} - {"(top)"} == PROXY_ROOMS.keys()


def test_the_proxys_rooms_import_only_the_rooms_below_them():
    for module, targets in GRAPH.items():
        if not module.startswith(PROXY + ".") or _proxy_room(module) == "(top)":
            continue
        room = _proxy_room(module)
        used = {_proxy_room(t) for t in targets if t.startswith(PROXY + ".")} - {room}
        assert used <= PROXY_ROOMS[room], (module, used - PROXY_ROOMS[room])
        assert PROXY not in targets, (module, "imports the package's lazy names")
