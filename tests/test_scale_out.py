"""Three keeper-proxy replicas on one database, 64 agents on random replicas, one replica
SIGKILLed in the middle of a cut and started again: nothing lost, doubled or crossed."""

from __future__ import annotations

import pytest

from keeper_bench.scale_out import run

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def test_replicas_share_sessions_and_survive_a_replica_killed_mid_cut(postgres_url):
    # run() audits every session in the database and raises on any breach: a turn archived
    # twice or lost, NOTES versions unequal to cuts, another session's text, a client error
    result = run(postgres_url, replicas=3, sessions=64, turns=7, kill=True, direct=False)
    assert result["killed"] is not None, "a replica was killed while it waited for a note reply"
    assert result["calls"] == 64 * 7, "every agent call was answered"
    assert result["cuts"] == result["versions"] > 0
