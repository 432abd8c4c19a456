"""Per-session values are written as compact JSON that reads back as the very value, by orjson
where its text does and by the stdlib encoder otherwise (so what was refused is refused as
before), and the SQLite archive writes a batch that only upserts as one statement."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import sqlite3
from typing import Any

import pytest

from keeper_middleware.archive.json_text import dict_text, list_text, value_text
from keeper_middleware.archive.sqlite.archive import SQLiteArchive
from keeper_middleware.errors import ArchiveError, ArgumentTypeError


class _Colour(enum.Enum):
    RED = "red"


class _Level(enum.IntEnum):
    HIGH = 3


@dataclasses.dataclass
class _Point:
    x: int


@pytest.mark.parametrize(
    "value",
    [
        {"content": "café ☕", "id": None, "n": 2.5, "ok": True, "calls": [{"args": {}}]},
        [1, -2, 10**18, 1e16, 1e-7, 0.1, -0.0, "", "\u2028", "\x00 \x1f \x7f"],
        {'we"ird\nkéy': {"": None}},
        "just text",
        17,
        None,
    ],
)
def test_a_value_is_written_as_compact_json_that_reads_back_as_it(value: Any) -> None:
    text = value_text(value)
    assert json.loads(text) == value
    assert json.loads(text.encode()) == value  # as UTF-8, as it is stored


def test_a_message_like_value_is_written_without_spaces() -> None:
    value = {"type": "ai", "data": {"content": "a, b: c", "id": None, "tool_calls": []}}
    assert (
        value_text(value) == '{"type":"ai","data":{"content":"a, b: c","id":null,"tool_calls":[]}}'
    )


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ({1: "a", None: "b"}, '{"1":"a","null":"b"}'),  # keys as the stdlib writes them
        ((1, (2, 3)), "[1,[2,3]]"),  # tuples as lists
        (10**30, "1000000000000000000000000000000"),  # past 64 bits
        ("a lone \ud800 surrogate", '"a lone \ud800 surrogate"'),
        ({"level": _Level.HIGH}, '{"level":3}'),
    ],
)
def test_what_orjson_does_not_write_as_is_is_written_as_the_stdlib_writes_it(
    value: Any, written: str
) -> None:
    assert value_text(value) == written


@pytest.mark.parametrize("value", [float("nan"), [float("inf")], {"a": -float("inf")}])
def test_a_non_finite_float_is_refused_not_written_as_null(value: Any) -> None:
    with pytest.raises(ValueError, match="not JSON compliant"):
        value_text(value)


@pytest.mark.parametrize(
    "value",
    [datetime.datetime(2026, 1, 2), _Point(1), _Colour.RED, {"when": datetime.date(2026, 1, 2)}],
)
def test_a_value_the_stdlib_refuses_is_refused_though_orjson_would_write_it(value: Any) -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        value_text(value)


def test_texts_joined_are_the_text_of_the_whole() -> None:
    entries = [{"a": 1}, "x", None]
    assert list_text(map(value_text, entries)) == value_text(entries)
    mapping = {"window": entries, "n": 2}
    assert dict_text({k: value_text(v) for k, v in mapping.items()}) == value_text(mapping)


def _statements(archive: SQLiteArchive) -> list[str]:
    """Every statement the archive's connection runs from now on."""
    seen: list[str] = []
    archive._live().set_trace_callback(seen.append)
    return seen


def test_a_batch_that_only_upserts_is_one_statement(tmp_path) -> None:
    archive = SQLiteArchive(str(tmp_path / "a.db"))
    archive.put_values("s", {"head": {"generation": 1}, "old": [1]})
    seen = _statements(archive)
    archive.put_values("s", {"piece.2": ["m2"], "head": {"generation": 2}, "counters": {"n": 2}})
    assert len(seen) == 1 and seen[0].startswith("INSERT INTO kv")
    assert archive.get_value("s", "head") == {"generation": 2}
    assert archive.get_value("s", "piece.2") == ["m2"]
    assert archive.get_value("s", "old") == [1]
    archive.close()


def test_a_batch_that_deletes_runs_as_one_transaction(tmp_path) -> None:
    archive = SQLiteArchive(str(tmp_path / "a.db"))
    archive.put_values("s", {"head": 1, "old": [1]})
    seen = _statements(archive)
    archive.put_values("s", {"head": 2, "old": None})
    assert seen[0] == "BEGIN IMMEDIATE" and seen[-1] == "COMMIT"
    assert (archive.get_value("s", "head"), archive.get_value("s", "old")) == (2, None)
    archive.close()


def test_a_batch_is_never_joined_to_a_transaction_left_open(tmp_path) -> None:
    archive = SQLiteArchive(str(tmp_path / "a.db"))
    archive.put_values("s", {"head": 1})
    archive._live().execute("BEGIN")
    with pytest.raises(ArchiveError, match="within a transaction"):
        archive.put_values("s", {"head": 2})
    archive._live().execute("ROLLBACK")
    assert archive.get_value("s", "head") == 1
    archive.close()


def test_a_session_erased_by_another_process_is_written_again(tmp_path) -> None:
    path = str(tmp_path / "a.db")
    archive = SQLiteArchive(path)
    archive.put_values("s", {"head": 1})
    other = sqlite3.connect(path)
    other.execute("PRAGMA foreign_keys=ON")
    other.execute("DELETE FROM sessions WHERE session = 's'")
    other.commit()
    other.close()
    assert archive.get_value("s", "head") is None
    archive.put_values("s", {"head": 2, "counters": {"n": 1}})
    assert (archive.get_value("s", "head"), archive.get_value("s", "counters")) == (2, {"n": 1})
    assert "s" in archive.sessions()
    archive.close()


def test_a_batch_with_a_value_that_is_not_json_able_writes_nothing(tmp_path) -> None:
    archive = SQLiteArchive(str(tmp_path / "a.db"))
    archive.put_values("s", {"head": 1})
    with pytest.raises(ArgumentTypeError, match="'counters' must be JSON-able"):
        archive.put_values("s", {"head": 2, "counters": {"rate": float("nan")}})
    assert archive.get_value("s", "head") == 1
    archive.close()
