"""Everything raised on purpose is a KeeperError, and a bad argument to the public API says which
argument it was.

Each case calls the public API the way a user could get it wrong; the error must be a
``KeeperError`` (and still the builtin a caller may already catch), and its message must name the
argument, so the fix is obvious without reading the traceback.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel

from keeper_middleware import (
    ApproximateTokenCounter,
    ArgumentTypeError,
    ConfigurationError,
    InvalidStateError,
    Keeper,
    KeeperConfig,
    KeeperError,
    KeeperNode,
    MalformedDataError,
    Notes,
    Passage,
    create_keeper_agent,
    parse_notes,
)
from keeper_middleware.archive.store import open_archive
from keeper_middleware.retrievers import KeywordRetriever, make_retriever

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("keeper_middleware", "retrievers", "graphs", "integrations")


def _model() -> FakeListChatModel:
    return FakeListChatModel(responses=["ok"])


def _langchain(**kwargs: Any) -> Any:
    from keeper_middleware.integrations.langchain import KeeperMiddleware

    return KeeperMiddleware(_model(), **kwargs)


def _hook(**kwargs: Any) -> Any:
    from keeper_middleware.integrations.langchain import keeper_pre_model_hook

    return keeper_pre_model_hook(_model(), **kwargs)


def _closed_keyword_search(tmp_path: Path) -> Any:
    retriever = KeywordRetriever(tmp_path / "index.sqlite3")
    retriever.close()
    return retriever.search("x", session="s", k=1)


BAD_ARGUMENTS: list[tuple[str, Callable[[Path], Any], type[Exception], str]] = [
    ("retriever name", lambda p: Keeper(retriever="bm25"), ValueError, "retriever"),
    ("retriever type", lambda p: make_retriever(42, path=p), TypeError, "retriever"),
    ("archive type", lambda p: Keeper(archive=123), TypeError, "archive"),
    (
        "archive in agent",
        lambda p: create_keeper_agent(_model(), archive=123),
        TypeError,
        "archive",
    ),
    ("window", lambda p: KeeperConfig(window=10), ValueError, "window"),
    ("negative window", lambda p: KeeperConfig(window=-5), ValueError, "window"),
    ("reply reserve", lambda p: KeeperConfig(reply_reserve=-1), ValueError, "reply_reserve"),
    ("notes cadence", lambda p: KeeperConfig(notes_every_items=0), ValueError, "notes_every_items"),
    ("passages", lambda p: KeeperConfig(passages="pages"), ValueError, "passages"),
    ("token counter name", lambda p: Keeper(token_counter="nope"), ValueError, "token_counter"),
    ("token counter type", lambda p: Keeper(token_counter=3.5), TypeError, "token_counter"),
    (
        "chars per token",
        lambda p: ApproximateTokenCounter(chars_per_token=0),
        ValueError,
        "chars_per_token",
    ),
    (
        "passage position",
        lambda p: Passage(session="s", item=1, position="0", text="t"),
        TypeError,
        "position",
    ),
    (
        "passage session",
        lambda p: Passage(session="", item=1, position=0, text="t"),
        ValueError,
        "session",
    ),
    ("notes range", lambda p: Notes(first_item=5, last_item=2), ValueError, "Item range"),
    ("notes text", lambda p: parse_notes("hello"), ValueError, "NOTES"),
    ("open_archive type", lambda p: open_archive(object()), TypeError, "archive"),
    ("node model", lambda p: KeeperNode(Keeper(), model=3), ValueError, "model"),
    ("middleware retriever", lambda p: _langchain(retriever="bm25"), ValueError, "retriever"),
    ("hook archive", lambda p: _hook(archive=123), TypeError, "archive"),
    (
        "search k",
        lambda p: KeywordRetriever(p / "i.sqlite3").search("x", session="s", k=0),
        ValueError,
        "k",
    ),
    ("closed retriever", _closed_keyword_search, RuntimeError, "closed"),
]


@pytest.mark.parametrize(
    ("call", "builtin", "named"),
    [pytest.param(c, b, n, id=i) for i, c, b, n in BAD_ARGUMENTS],
)
def test_a_bad_argument_raises_a_keeper_error_that_names_it(tmp_path, call, builtin, named):
    with pytest.raises(KeeperError) as caught:
        call(tmp_path)
    assert isinstance(caught.value, builtin), type(caught.value).__mro__
    assert re.search(rf"\b{re.escape(named)}\b", str(caught.value)), str(caught.value)


def test_each_kind_of_error_keeps_the_builtin_it_replaced():
    assert issubclass(ConfigurationError, ValueError)
    assert issubclass(ArgumentTypeError, TypeError)
    assert issubclass(MalformedDataError, ValueError)
    assert issubclass(InvalidStateError, RuntimeError)
    for kind in (ConfigurationError, ArgumentTypeError, MalformedDataError, InvalidStateError):
        assert issubclass(kind, KeeperError)


RAW = re.compile(r"\braise (ValueError|TypeError|RuntimeError|KeyError|LookupError|Exception)\b")
ALLOWED_BASES = {"Exception", "ValueError", "TypeError", "RuntimeError", "ConnectionError"}


def _product_files() -> list[Path]:
    return [p for folder in PRODUCT for p in (ROOT / folder).rglob("*.py") if p.is_file()]


def test_no_product_module_raises_a_bare_builtin():
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _product_files()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if RAW.search(line)
    ]
    assert found == []


def test_every_error_class_of_the_product_is_a_keeper_error():
    """A class named ...Error must derive from KeeperError (or another error of the package)."""
    import keeper_middleware.errors as errors

    ours = {name for name in dir(errors) if name.endswith("Error")}
    offenders = []
    for path in _product_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef) or not node.name.endswith("Error"):
                continue
            bases = {ast.unparse(b).rpartition(".")[2] for b in node.bases}
            if node.name.startswith("_") or node.name == "KeeperError":
                continue
            if bases <= ALLOWED_BASES:
                offenders.append(f"{path.relative_to(ROOT)}: {node.name}({', '.join(bases)})")
            ours.add(node.name)
    assert offenders == []
