"""The package-dir mapping works outside an editable install: build the wheel, install it in a
fresh venv, import every subpackage."""

from __future__ import annotations

import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUBPACKAGES = ["retrievers", "graphs", "integrations", "integrations.proxy", "bench"]


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
    (site_dir / "deps.pth").write_text(f"{target}\n" + "\n".join(site.getsitepackages()) + "\n")
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
