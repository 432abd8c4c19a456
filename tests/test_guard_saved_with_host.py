"""The search guard while a host saves the session itself (the proxy, once a request): read once,
written with the host's own save, and still read at every use everywhere else (arms that manage
their own memory reset it in the archive directly)."""

from __future__ import annotations

from pathlib import Path

import pytest

from keeper_middleware import Keeper, KeeperConfig, SQLiteArchive
from keeper_middleware.archive.store import put_values
from keeper_middleware.search.guards import GuardState, after_new_input
from keeper_middleware.sessions.state import GUARD_KEY

CONFIG = KeeperConfig(window=4096, reply_reserve=512)
SESSION = "guarded"


@pytest.fixture
def keeper(tmp_path: Path) -> Keeper:
    return Keeper(CONFIG, archive=SQLiteArchive(tmp_path / "keeper.sqlite3"))


def _stored(keeper: Keeper) -> GuardState:
    return GuardState.from_json(keeper.archive.get_value(SESSION, GUARD_KEY))


def test_a_direct_reset_in_the_archive_is_read_at_the_next_use(keeper: Keeper) -> None:
    withheld = GuardState(since_input=4, withheld=True)
    keeper.sessions.set_guard(SESSION, withheld)
    assert _stored(keeper) == withheld  # written at once outside a host's save
    keeper.archive.put_value(SESSION, GUARD_KEY, after_new_input(withheld).to_json())
    assert keeper.sessions.guard(SESSION) == GuardState()


def test_the_guard_goes_with_the_hosts_save_and_is_read_once(keeper: Keeper) -> None:
    sessions = keeper.sessions
    sessions.set_guard(SESSION, GuardState(since_input=2))
    with sessions.hold(SESSION), sessions.saving_later(SESSION):
        assert sessions.guard(SESSION) == GuardState(since_input=2)
        # nothing else writes the session while its host holds it: a change made behind the
        # host's back is not read again within the save
        keeper.archive.put_value(SESSION, GUARD_KEY, GuardState(since_input=9).to_json())
        assert sessions.guard(SESSION) == GuardState(since_input=2)
        sessions.set_guard(SESSION, GuardState(since_input=3, withheld=True))
        assert sessions.guard(SESSION) == GuardState(since_input=3, withheld=True)
        assert _stored(keeper) == GuardState(since_input=9)  # not written on its own
        values = sessions.unsaved_values(SESSION)
        assert GuardState.from_json(values[GUARD_KEY]) == GuardState(since_input=3, withheld=True)
        put_values(keeper.archive, SESSION, values)  # the host's save
        sessions.values_saved(SESSION, values)
        assert GUARD_KEY not in sessions.unsaved_values(SESSION)
    assert _stored(keeper) == GuardState(since_input=3, withheld=True)
    keeper.archive.put_value(SESSION, GUARD_KEY, GuardState().to_json())
    assert sessions.guard(SESSION) == GuardState()  # after the save: read at every use again


def test_a_guard_set_after_the_hosts_last_save_is_written_at_the_end(keeper: Keeper) -> None:
    sessions = keeper.sessions
    with sessions.hold(SESSION), sessions.saving_later(SESSION):
        sessions.set_guard(SESSION, GuardState(sample_next=True))
        assert _stored(keeper) == GuardState()
    assert _stored(keeper) == GuardState(sample_next=True)
    with sessions.hold(SESSION), sessions.saving_later(SESSION):
        assert sessions.guard(SESSION) == GuardState(sample_next=True)
    assert _stored(keeper) == GuardState(sample_next=True)  # read only: nothing written


def test_an_erased_session_keeps_no_guard_from_its_host(keeper: Keeper) -> None:
    sessions = keeper.sessions
    with sessions.hold(SESSION), sessions.saving_later(SESSION):
        sessions.set_guard(SESSION, GuardState(withheld=True))
        sessions.drop(SESSION)
    assert keeper.archive.get_value(SESSION, GUARD_KEY) is None


def test_the_next_host_save_starts_from_the_guard_the_last_one_left(keeper: Keeper) -> None:
    """On an archive no other process serves, every write of the guard goes through the keeper:
    what a host's save left is still right at its next one, so it is not read again there."""
    sessions = keeper.sessions
    with sessions.hold(SESSION), sessions.saving_later(SESSION):
        sessions.set_guard(SESSION, GuardState(since_input=5))
    assert _stored(keeper) == GuardState(since_input=5)
    keeper.archive.put_value(SESSION, GUARD_KEY, GuardState(since_input=9).to_json())
    with sessions.hold(SESSION), sessions.saving_later(SESSION):
        assert sessions.guard(SESSION) == GuardState(since_input=5)  # not read again
    assert sessions.guard(SESSION) == GuardState(since_input=9)  # outside a host's save: read
    sessions.set_guard(SESSION, GuardState(withheld=True))  # written through the keeper
    with sessions.hold(SESSION), sessions.saving_later(SESSION):
        assert sessions.guard(SESSION) == GuardState(withheld=True)
    sessions.drop(SESSION)  # erased: nothing of it remembered
    keeper.archive.put_value(SESSION, GUARD_KEY, GuardState(since_input=1).to_json())
    with sessions.hold(SESSION), sessions.saving_later(SESSION):
        assert sessions.guard(SESSION) == GuardState(since_input=1)


@pytest.mark.postgres
def test_on_a_shared_archive_each_host_save_reads_what_another_replica_wrote(
    postgres_url: str, pg_schema: str
) -> None:
    from keeper_middleware.archive.postgres import PostgresArchive

    one = Keeper(CONFIG, archive=PostgresArchive(postgres_url, schema=pg_schema))
    other = Keeper(CONFIG, archive=PostgresArchive(postgres_url, schema=pg_schema))
    try:
        with one.sessions.hold(SESSION), one.sessions.saving_later(SESSION):
            one.sessions.set_guard(SESSION, GuardState(since_input=5))
        with other.sessions.hold(SESSION), other.sessions.saving_later(SESSION):
            assert other.sessions.guard(SESSION) == GuardState(since_input=5)
            other.sessions.set_guard(SESSION, GuardState(since_input=6, withheld=True))
        with one.sessions.hold(SESSION), one.sessions.saving_later(SESSION):
            assert one.sessions.guard(SESSION) == GuardState(since_input=6, withheld=True)
    finally:
        one.close()
        other.close()


@pytest.mark.anyio
async def test_a_proxy_request_with_new_input_saves_the_reset_guard(tmp_path: Path) -> None:
    """The stop line withheld the tool; the client's next question lifts it, and the guard the
    request leaves in the archive (written with its one save) says so."""
    from tests.proxy_upstream import ScriptedUpstream, chat, client_for, convo, make_app

    upstream = ScriptedUpstream()
    app = make_app(upstream, tmp_path)
    proxy = app.state.proxy
    session = "default:asking"
    proxy.keeper.archive.put_value(
        session, GUARD_KEY, GuardState(since_input=6, withheld=True).to_json()
    )
    history = convo("Task: keep the ledger.", "ok", "Item 1: domo1 is 7. What is domo1?")
    async with client_for(app) as client:
        answered = await client.post(
            "/v1/chat/completions", json=chat(history), headers={"X-Keeper-Session": "asking"}
        )
    assert answered.status_code == 200
    stored = GuardState.from_json(proxy.keeper.archive.get_value(session, GUARD_KEY))
    assert not stored.withheld and stored.since_input == 0
    assert proxy.keeper.search_offered(session)
    await proxy.aclose()
