"""The packaging works outside an editable install: build the wheel, install it in a fresh venv,
import every subpackage.

retrievers/, graphs/ and integrations/ are reached through committed symlinks under
keeper_middleware/ (docs/architecture.md): the wheel and the sdist must hold the files they point
at, never the links, and a script run from the repository root must import the same names. The
benchmark is its own distribution (bench/, ``keeper-bench``): the product's wheel holds none of
it, and the benchmark's wheel installs beside the product's and runs."""

from __future__ import annotations

import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUBPACKAGES = [
    "archive",
    "search",
    "retrievers",
    "graphs",
    "integrations",
    "integrations.proxy",
]


@pytest.mark.wheel
def test_the_wheel_installs_every_subpackage_under_keeper_middleware(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(dist),
            str(ROOT),
        ],
        check=True,
        cwd=tmp_path,
    )
    (wheel,) = dist.glob("keeper_middleware-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for sub in SUBPACKAGES:
        assert f"keeper_middleware/{sub.replace('.', '/')}/__init__.py" in names
    assert not any(n.split("/")[0] in SUBPACKAGES for n in names), (
        "a subpackage leaked to top level"
    )

    venv = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    target = tmp_path / "installed"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
    )
    # the fresh venv gets the wheel's files plus the dependencies (not this checkout)
    site_dir = next((venv / "lib").glob("python3*/site-packages"))
    # every site dir this interpreter reads, including ones a .pth file adds (a layered venv)
    deps = dict.fromkeys(
        [*site.getsitepackages(), *(p for p in sys.path if p.endswith("site-packages"))]
    )
    (site_dir / "deps.pth").write_text(f"{target}\n" + "\n".join(deps) + "\n")
    code = (
        "import keeper_middleware, importlib, pathlib\n"
        f"for sub in {SUBPACKAGES!r}:\n"
        "    m = importlib.import_module('keeper_middleware.' + sub)\n"
        f"    assert pathlib.Path(m.__file__).is_relative_to({str(target)!r}), m.__file__\n"
        "from keeper_middleware import create_keeper_agent, KeeperConfig, Keeper, KeeperNode\n"
        "from keeper_middleware.integrations.proxy.cli import main\n"
        "print('ok')\n"
    )
    result = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"

    # from the repository root the checkout's keeper_middleware/ comes first on sys.path; its
    # symlinks give it the same subpackages as the wheel
    from_root = (
        "import importlib\n"
        f"for sub in {SUBPACKAGES!r}:\n"
        "    importlib.import_module('keeper_middleware.' + sub)\n"
        "from keeper_middleware.retrievers import EmbeddingRetriever, KeywordRetriever\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [str(python), "-c", from_root], capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


LINKED = ("retrievers", "graphs", "integrations")


def test_the_linked_folders_are_symlinks_to_the_top_level_folders():
    for name in LINKED:
        link = ROOT / "keeper_middleware" / name
        assert link.is_symlink(), f"keeper_middleware/{name} should be a symlink to ../{name}"
        assert link.resolve() == (ROOT / name).resolve()


def _entries_by_mode(wheel: Path) -> dict[str, int]:
    return {info.filename: info.external_attr >> 16 for info in zipfile.ZipFile(wheel).infolist()}


@pytest.mark.wheel
def test_the_wheel_and_the_sdist_hold_the_files_the_symlinks_point_at(built_wheel, tmp_path):
    import stat
    import tarfile

    modes = _entries_by_mode(built_wheel)
    for name in LINKED:
        inside = [n for n in modes if n.startswith(f"keeper_middleware/{name}/")]
        expected = {
            f"keeper_middleware/{name}/{p.relative_to(ROOT / name).as_posix()}"
            for p in (ROOT / name).rglob("*.py")
        }
        assert expected <= set(inside), sorted(expected - set(inside))[:5]
        assert not any(stat.S_ISLNK(modes[n]) for n in inside)
    assert not any(n.split("/")[0] in LINKED for n in modes), "a folder leaked to top level"

    subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--sdist",
            "--no-isolation",
            "-o",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    (sdist,) = tmp_path.glob("keeper_middleware-*.tar.gz")
    with tarfile.open(sdist) as archive:
        members = {m.name.split("/", 1)[1]: m for m in archive.getmembers() if "/" in m.name}
    for name in LINKED:
        assert f"keeper_middleware/{name}/__init__.py" in members
        assert not any(m.issym() for m in members.values()), "the sdist holds a symlink"


@pytest.mark.wheel
def test_building_the_wheel_gives_no_setuptools_warning(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-v",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [line for line in (result.stdout + result.stderr).splitlines() if "Warning:" in line]
    assert warnings == [], warnings


# ---------------------------------------------------------------------------- one extra at a time
#
# Each extra must install what its entry point imports. A venv gets the wheel plus exactly the
# distributions that ``keeper-middleware[extra]`` requires (resolved from the installed
# packages' own metadata, linked file by file, so nothing else is importable), then runs the
# entry point the extra is for. Packages come from this environment: PyPI is reached at install
# time only.


def _requirement_closure(extras: tuple[str, ...], more: list[str] | None = None) -> set[str]:
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    wanted: list[tuple[str, tuple[str, ...]]] = []
    project = Requirement(
        f"keeper-middleware[{','.join(extras)}]" if extras else "keeper-middleware"
    )
    seen: set[tuple[str, str]] = set()
    found: set[str] = set()

    def requirements_of(name: str, extra_names: tuple[str, ...]) -> list[Requirement]:
        if canonicalize_name(name) == "keeper-middleware":
            raw = _own_requirements()
        else:
            raw = metadata.requires(name) or []
        chosen = []
        for line in raw:
            requirement = Requirement(line)
            marker = requirement.marker
            if marker is None or any(marker.evaluate({"extra": e}) for e in (*extra_names, "")):
                chosen.append(requirement)
        return chosen

    wanted.append((project.name, tuple(project.extras)))
    for line in more or []:
        requirement = Requirement(line)
        wanted.append((requirement.name, tuple(requirement.extras)))
    while wanted:
        name, extra_names = wanted.pop()
        key = (canonicalize_name(name), ",".join(sorted(extra_names)))
        if key in seen:
            continue
        seen.add(key)
        if canonicalize_name(name) != "keeper-middleware":
            found.add(canonicalize_name(name))
        for requirement in requirements_of(name, extra_names):
            if canonicalize_name(requirement.name) == "keeper-middleware":
                wanted.append((requirement.name, tuple(requirement.extras)))
                continue
            try:
                metadata.distribution(requirement.name)
            except metadata.PackageNotFoundError:
                if requirement.marker is not None:
                    continue  # a platform- or version-only dependency this machine has no need of
                raise
            wanted.append((requirement.name, tuple(requirement.extras)))
    return found


def _with_extra(requirement: str, extra: str) -> str:
    """The requirement as the wheel's metadata writes it: its own marker, if any, and the extra."""
    spec, _, marker = requirement.partition(";")
    if marker.strip():
        return f'{spec.strip()}; ({marker.strip()}) and extra == "{extra}"'
    return f'{spec.strip()}; extra == "{extra}"'


def _own_requirements() -> list[str]:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra, requirements in project["optional-dependencies"].items():
        lines += [_with_extra(r, extra) for r in requirements]
    return lines


def _link_distributions(names: set[str], site_dir: Path) -> None:
    """Every file of each distribution, linked into ``site_dir`` (namespace packages shared by
    several distributions get only their own files)."""
    from importlib import metadata

    for name in names:
        dist = metadata.distribution(name)
        for file in dist.files or []:
            parts = Path(str(file)).parts
            if not parts or parts[0] == ".." or "__pycache__" in parts:
                continue
            source = Path(str(dist.locate_file(file)))
            target = site_dir.joinpath(*parts)
            if target.exists() or not source.exists():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(source)


@pytest.fixture(scope="module")
def built_wheel(tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(dist),
            str(ROOT),
        ],
        check=True,
        cwd=dist,
    )
    (wheel,) = dist.glob("keeper_middleware-*.whl")
    return wheel


def _venv_with(
    extras: tuple[str, ...],
    wheel: Path,
    folder: Path,
    *,
    also: tuple[Path, ...] = (),
    more: list[str] | None = None,
) -> Path:
    """A venv with ``wheel`` (and the wheels ``also``) installed, plus exactly what
    ``keeper-middleware[extras]`` and the requirements ``more`` need, linked from here."""
    venv = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site_dir = next((venv / "lib").glob("python3*/site-packages"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--target",
            str(site_dir),
            str(wheel),
            *map(str, also),
        ],
        check=True,
    )
    _link_distributions(_requirement_closure(extras, more or []), site_dir)
    return venv / "bin" / "python"


ENTRY = (
    "import sys\nfrom importlib.metadata import entry_points\n"
    "(point,) = [e for e in entry_points(group='console_scripts') if e.name == sys.argv[1]]\n"
    "sys.argv = sys.argv[1:]\nsys.exit(point.load()())\n"
)


def _quickstart() -> str:
    import re

    guide = (ROOT / "docs" / "quickstart.md").read_text()
    return re.findall(r"```python\n(.*?)```", guide, re.DOTALL)[0]


QUICKSTART = _quickstart()
"""The quickstart (docs/quickstart.md): the base install runs it (its model is
``keeper_middleware.testing``'s)."""
EMBEDDINGS = (
    "from keeper_middleware.retrievers import EmbeddingRetriever, Passage\n"
    "r = EmbeddingRetriever()\n"
    "r.add([Passage(session='s', item=1, position=0, text='The ferry left at dawn.')])\n"
    "print(r.search('boat departure', session='s', k=1)[0].passage.text)\n"
)


def _run(
    python: Path, *args: str, cwd: Path, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [str(python), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout
    )


@pytest.mark.wheel
def test_the_base_install_runs_the_keeper_and_names_the_extra_for_the_rest(built_wheel, tmp_path):
    python = _venv_with((), built_wheel, tmp_path)
    quick = _run(python, "-c", QUICKSTART, cwd=tmp_path)
    assert quick.returncode == 0, quick.stderr
    assert quick.stdout.split() == ["1.", "overdrawn", "2.", "Mira", "Holt"]
    proxy = _run(
        python,
        "-c",
        ENTRY,
        "keeper-proxy",
        "--upstream",
        "http://127.0.0.1:9/v1",
        "--window",
        "4096",
        cwd=tmp_path,
    )
    assert proxy.returncode == 2 and "pip install 'keeper-middleware[proxy]'" in proxy.stderr
    archive = _run(python, "-c", ENTRY, "keeper-archive", "--help", cwd=tmp_path)
    assert archive.returncode == 0 and "migrate" in archive.stdout, archive.stderr
    middleware = _run(python, "-c", "import keeper_middleware.integrations.langchain", cwd=tmp_path)
    assert "pip install 'keeper-middleware[langchain]'" in middleware.stderr
    for module in ("tqdm", "langchain_openai", "langchain", "starlette"):
        assert _run(python, "-c", f"import {module}", cwd=tmp_path).returncode != 0, module


BENCHMARK_FILES = ("keeper_bench/", "keeper_middleware/bench/", "self_edit/", "/peers.py")
"""What of the benchmark could leak into the product's wheel: its package, the old in-package
path, and the comparison arms only the benchmark runs (the peers, the self-editing arms)."""


@pytest.mark.wheel
def test_the_product_wheel_holds_no_benchmark_code(built_wheel):
    archive = zipfile.ZipFile(built_wheel)
    names = archive.namelist()
    assert [n for n in names if any(part in n for part in BENCHMARK_FILES)] == []
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    scripts = archive.read(entry_points).decode()
    assert "keeper-proxy" in scripts and "keeper-bench" not in scripts
    (metadata_file,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    metadata = archive.read(metadata_file).decode()
    assert "Provides-Extra: bench" not in metadata
    for bench_only in ("deepagents", "langmem", "matplotlib", "nltk", "tqdm"):
        assert f"Requires-Dist: {bench_only}" not in metadata, bench_only
    sources = [n for n in names if n.endswith(".py")]
    assert len(sources) > 100
    naming = [n for n in sources if b"keeper_bench" in archive.read(n)]
    assert naming == []
    # the prebuilt graphs the product ships stay in it
    for graph in ("baselines", "rag", "keeper_arms", "arms"):
        assert f"keeper_middleware/graphs/{graph}.py" in names


@pytest.fixture(scope="module")
def built_bench_wheel(tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("bench-dist")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-v",
            "-w",
            str(dist),
            str(ROOT / "bench"),
        ],
        capture_output=True,
        text=True,
        cwd=dist,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [line for line in (result.stdout + result.stderr).splitlines() if "Warning:" in line]
    assert warnings == [], warnings
    (wheel,) = dist.glob("keeper_bench-*.whl")
    return wheel


@pytest.mark.wheel
def test_the_benchmark_builds_as_its_own_distribution(built_bench_wheel):
    archive = zipfile.ZipFile(built_bench_wheel)
    names = archive.namelist()
    expected = {
        p.relative_to(ROOT / "bench").as_posix()
        for p in (ROOT / "bench" / "keeper_bench").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert expected <= set(names), sorted(expected - set(names))[:5]
    assert any(n.startswith("keeper_bench/marathon/plans/") and n.endswith(".json") for n in names)
    assert not any(n.startswith(("keeper_middleware/", "results/")) for n in names)
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "keeper-bench = keeper_bench.cli:main" in archive.read(entry_points).decode()
    (metadata_file,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    assert "Requires-Dist: keeper-middleware[langchain,proxy]" in archive.read(
        metadata_file
    ).decode().replace(", ", ",")


def _bench_requirements() -> tuple[tuple[str, ...], list[str]]:
    """The product's extras keeper-bench asks for, and its other requirements."""
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "bench" / "pyproject.toml").read_text())["project"]
    extras: tuple[str, ...] = ()
    others = []
    for line in project["dependencies"]:
        requirement = Requirement(line)
        if requirement.name == "keeper-middleware":
            extras = tuple(sorted(requirement.extras))
        else:
            others.append(line)
    return extras, others


@pytest.mark.wheel
def test_keeper_bench_installed_beside_the_product_runs(built_wheel, built_bench_wheel, tmp_path):
    extras, others = _bench_requirements()
    python = _venv_with(extras, built_wheel, tmp_path, also=(built_bench_wheel,), more=others)
    out = tmp_path / "run"
    result = _run(
        python,
        "-c",
        ENTRY,
        "keeper-bench",
        "run",
        "--arm",
        "notes",
        "--stream",
        "tiny",
        "--model",
        "sim",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "grade.json").exists() or any(out.iterdir())
    peer = _run(python, "-c", "import keeper_bench.arms.peers, deepagents, langmem", cwd=tmp_path)
    assert peer.returncode == 0, peer.stderr[-3000:]


@pytest.mark.wheel
def test_the_proxy_extra_alone_serves_keeper_proxy(built_wheel, tmp_path):
    import socket
    import time

    import httpx

    python = _venv_with(("proxy",), built_wheel, tmp_path)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [
            str(python),
            "-c",
            ENTRY,
            "keeper-proxy",
            "--upstream",
            "http://127.0.0.1:9/v1",
            "--window",
            "4096",
            "--port",
            str(port),
            "--archive-dir",
            str(tmp_path / "state"),
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
                break
            except httpx.TransportError:
                assert server.poll() is None, server.stdout.read() if server.stdout else ""
                assert time.monotonic() < deadline, "keeper-proxy did not start"
                time.sleep(0.3)
        assert response.status_code == 200
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.wheel
def test_the_langchain_extra_alone_runs_the_middleware_example(built_wheel, tmp_path):
    python = _venv_with(("langchain",), built_wheel, tmp_path)
    result = _run(python, str(ROOT / "examples" / "middleware_agent.py"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.wheel
@pytest.mark.real_model
def test_the_embeddings_extra_alone_embeds_and_searches(built_wheel, tmp_path):
    python = _venv_with(("embeddings",), built_wheel, tmp_path)
    result = _run(python, "-c", EMBEDDINGS, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "The ferry left at dawn."
