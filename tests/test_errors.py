"""One error tree: every mistake a user can make in configuring the keeper is a
``ConfigurationError`` naming the field and the fix, every unusable archive an ``ArchiveError``
naming the path; all are ``KeeperError``s."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from langchain_core.tools import tool

from keeper_middleware import (
    ArchiveError,
    ConfigurationError,
    Keeper,
    KeeperConfig,
    KeeperError,
    MissingDependencyError,
    SQLiteArchive,
    create_keeper_agent,
)
from keeper_middleware.integrations.langchain import KeeperMiddleware, keeper_pre_model_hook
from keeper_middleware.retrievers import MissingExtraError, RetrieverError, ServerUnavailableError
from tests.fake_model import ScriptedChatModel

ROOT = Path(__file__).resolve().parents[1]


def test_every_error_of_the_library_is_a_keeper_error():
    assert MissingExtraError is MissingDependencyError
    for error in (MissingDependencyError, RetrieverError, ServerUnavailableError, ArchiveError):
        assert issubclass(error, KeeperError)
    missing = MissingExtraError("chromadb", "embeddings", needed_by="The embedding backend")
    assert isinstance(missing, ImportError) and missing.name == "chromadb"
    assert "pip install 'keeper-middleware[embeddings]'" in str(missing)


@pytest.mark.parametrize(
    ("settings", "names"),
    [
        ({"window": "4096"}, r"window='4096' is a str.*window=4096"),
        ({"window": 4096.0}, r"window=4096.0 is a float"),
        ({"window": 100}, r"window=100 is too small; use at least 1024"),
        ({"reply_reserve": -1}, r"reply_reserve=-1"),
        ({"item_pattern": "Item (\\d+"}, r"item_pattern=.* is not a valid regular expression"),
        ({"item_pattern": "^Item \\d+"}, r"item_pattern=.* has no capture group"),
        ({"question_patterns": ("(",)}, r"question_patterns="),
        ({"question_patterns": "\\?$"}, r"question_patterns=.*tuple of strings"),
        ({"tracked_names": "[a-z"}, r"tracked_names="),
        ({"show_retrieved": -3}, r"show_retrieved=-3 is too small"),
        ({"max_reasks": -1}, r"max_reasks=-1"),
        ({"search_results": 20, "search_scan": 10}, r"search_scan=10 is below search_results=20"),
        ({"notes_every_items": 0}, r"notes_every_items=0"),
        ({"keyword_engine": "lucene"}, r"keyword_engine='lucene'; use 'auto', 'fts5' or 'tantivy'"),
        ({"item_tools": "read_next_batch"}, r"item_tools=.*\('read_next_batch',\)"),
        ({"thinking": {"on": {}}}, r"thinking=.*ThinkingPolicy"),
    ],
)
def test_a_bad_setting_names_the_field_and_the_fix(settings, names):
    with pytest.raises(ConfigurationError, match=names):
        KeeperConfig(**settings)


def test_a_dict_for_config_says_to_make_a_keeper_config():
    with pytest.raises(ConfigurationError, match=r"KeeperConfig\(\*\*your_dict\)"):
        Keeper({"window": 4096})  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="not a KeeperConfig"):
        create_keeper_agent(ScriptedChatModel(), config={"window": 4096})  # type: ignore[arg-type]


def test_a_keeper_and_its_own_arguments_together_are_refused():
    keeper = Keeper()
    model = ScriptedChatModel()
    for make in (
        lambda: create_keeper_agent(model, keeper=keeper, config=KeeperConfig(window=4096)),
        lambda: KeeperMiddleware(model, keeper=keeper, archive="x.sqlite3"),
        lambda: keeper_pre_model_hook(model, keeper=keeper, retriever="keyword"),
    ):
        with pytest.raises(ConfigurationError, match="keeper= was given together with"):
            make()


@tool
def search_archive(query: str) -> str:
    """The user's own search."""
    return query


def test_a_user_tool_named_like_the_search_tool_is_refused_unless_search_is_off():
    model = ScriptedChatModel(default="ok")
    with pytest.raises(ConfigurationError, match="rename yours, or pass search=False"):
        create_keeper_agent(model, [search_archive])
    with pytest.raises(ConfigurationError, match="search=False"):
        KeeperMiddleware(model, tools=[search_archive])
    agent = create_keeper_agent(model, [search_archive], search=False)
    assert agent.invoke({"messages": [("user", "hi")]})["messages"][-1].content == "ok"


def test_a_directory_as_the_archive_names_the_path(tmp_path):
    with pytest.raises(ArchiveError, match=f"{tmp_path}.*is a directory.*archive.sqlite3"):
        SQLiteArchive(tmp_path)
    with pytest.raises(ArchiveError, match="is a directory"):
        Keeper(archive=tmp_path)


def test_a_garbage_index_file_names_the_path_and_leaves_the_archive_alone(tmp_path):
    archive = tmp_path / "agent.sqlite3"
    Keeper(archive=archive).close()
    index = archive.with_suffix(".index") / "keyword.sqlite3"
    index.parent.mkdir(exist_ok=True)
    index.write_bytes(b"not an index at all " * 200)
    with pytest.raises(ArchiveError, match=f"keyword index '{index}'.*archive beside it"):
        Keeper(archive=archive)
    assert index.read_bytes() == b"not an index at all " * 200
    SQLiteArchive(archive).close()  # the archive itself still opens


READ_ONLY_OPEN = """
import sys
from keeper_middleware import ArchiveError, SQLiteArchive
try:
    SQLiteArchive(sys.argv[1])
except ArchiveError as error:
    print(error)
else:
    print("opened")
"""


def open_read_only(folder: Path, path: Path) -> str:
    """Open ``path`` where it cannot be written: as root (who may write any file) inside a
    private mount namespace with ``folder`` bind-mounted read-only; else with the modes cleared."""
    python = [sys.executable, "-c", READ_ONLY_OPEN, str(path)]
    if os.geteuid() == 0:
        if shutil.which("unshare") is None:
            pytest.skip("root without unshare cannot make a read-only folder")
        script = 'mount --bind -o ro "$0" "$0" && exec "$@"'
        command = ["unshare", "--mount", "sh", "-c", script, str(folder), *python]
    else:
        path.chmod(0o444)
        folder.chmod(0o555)
        command = python
    result = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
    if os.geteuid() == 0 and "mount" in result.stderr:
        pytest.skip(f"no mount namespace here: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_read_only_archive_is_refused_when_opened_not_at_its_first_cut(tmp_path):
    folder = tmp_path / "ro"
    path = folder / "agent.sqlite3"
    archive = SQLiteArchive(path)
    archive.put_value("s", "k", 1)
    archive.close()
    try:
        said = open_read_only(folder, path)
    finally:
        folder.chmod(0o755)
    assert "is read-only" in said and str(path) in said, said
    assert "make the file and its folder writable" in said
