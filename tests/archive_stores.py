"""Archive stores to test on, and turns to put in them, shared by the archive suites.

Every store test runs on SQLite and (postgres tier) on PostgreSQL: the ``spec`` fixture names
where a store lives as a string a child process can open too, ``store`` opens it. A suite takes
them by importing ``spec_fixture`` and ``store_fixture``. ``audit`` checks every invariant a crash
could break (gap-free seq, no turn twice, every archived cut recorded with its notes version).
"""

from __future__ import annotations

import json

import pytest

from keeper_middleware.archive.records import ArchivedTurn, NotesDraft
from keeper_middleware.archive.sqlite import SQLiteArchive
from keeper_middleware.archive.store import ArchiveStore


def make_turns(session: str, cut: int, count: int = 3, *, size: int = 20) -> list[ArchivedTurn]:
    """Turns whose msg_id names the cut they belong to, so an audit can group them."""
    return [
        ArchivedTurn(
            session=session,
            msg_id=f"c{cut}-t{j}",
            item=cut,
            role="human" if j % 2 == 0 else "ai",
            content=f"cut {cut} turn {j} " + "x" * size,
        )
        for j in range(count)
    ]


def notes_for(cut: int) -> NotesDraft:
    return NotesDraft(
        first_item=0,
        last_item=cut,
        text=f"[NOTES] after cut {cut}",
        data_json=json.dumps({"cut": cut}),
    )


def audit(store: ArchiveStore, session: str) -> dict[int, int]:
    """Check every invariant a crash could break; return turns per committed cut."""
    turns = list(store.turns(session))
    assert [t.seq for t in turns] == list(range(len(turns))), "seq must be gap-free"
    assert len({t.msg_id for t in turns}) == len(turns), "no turn twice"
    per_cut: dict[int, int] = {}
    for turn in turns:
        cut = int(turn.msg_id.split("-")[0][1:])
        per_cut[cut] = per_cut.get(cut, 0) + 1
    versions = list(store.notes_versions(session))
    assert [v.version for v in versions] == list(range(1, len(versions) + 1))
    for cut, count in per_cut.items():
        record = store.find_cut(session, f"cut-{cut}")
        assert record is not None, f"turns of cut {cut} are archived but the cut is not recorded"
        assert record.turns_archived == count
        assert record.notes_version is not None
        assert versions[record.notes_version - 1].cut_key == f"cut-{cut}"
    assert {int(v.cut_key.split("-")[1]) for v in versions} == set(per_cut)
    return per_cut


@pytest.fixture(
    name="spec", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def spec_fixture(request, tmp_path) -> str:
    """Where a store lives, as a string a child process can open too."""
    if request.param == "sqlite":
        return f"sqlite:{tmp_path / 'deep' / 'er' / 'keeper.sqlite'}"
    url = request.getfixturevalue("postgres_url")
    return f"postgres:{request.getfixturevalue('pg_schema')}:{url}"


def open_store(spec: str) -> ArchiveStore:
    kind, _, where = spec.partition(":")
    if kind == "sqlite":
        return SQLiteArchive(where)
    from keeper_middleware.archive.postgres import PostgresArchive

    schema, _, url = where.partition(":")
    return PostgresArchive(url, schema=schema)


@pytest.fixture(name="store")
def store_fixture(spec):
    with open_store(spec) as archive:
        yield archive


def _fields(turn: ArchivedTurn) -> dict[str, object]:
    return {name: getattr(turn, name) for name in ArchivedTurn.__slots__}
