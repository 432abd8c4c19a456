"""What the proxy reports: ``/metrics`` counts requests and cuts per tenant and shows the cached
share of prompt tokens as the upstream reported them (no session ids unless asked for), and
``/keeper/sessions/<id>`` gives one session's counters, NOTES and upstream calls."""

from __future__ import annotations

import pytest

from tests.proxy_upstream import (
    client_for,
    completion,
    make_app,
    run_items,
    upstream_fixture,  # noqa: F401
)

pytestmark = pytest.mark.anyio


# ----------------------------------------------------------------------------- counters


async def test_metrics_and_session_report(upstream, tmp_path):
    upstream.default = lambda body: completion(
        {"role": "assistant", "content": "ok"}, prompt=200, cached=150
    )
    app = make_app(upstream, tmp_path, window=2048)
    async with client_for(app) as client:
        await run_items(client, 12, "counted")
        metrics = (await client.get("/metrics")).text
        info = (await client.get("/keeper/sessions/counted")).json()
    assert 'keeper_proxy_requests_total{tenant="default"} 12.0' in metrics
    assert "counted" not in metrics  # no session ids unless asked for
    assert "# TYPE keeper_proxy_cuts_total counter" in metrics
    counters = info["counters"]
    work, notes = len(upstream.work_calls), len(upstream.note_calls)
    assert counters["prompt_tokens"] == 200 * work + 100 * notes  # notes replies: 100, none cached
    assert counters["cached_tokens"] == 150 * work
    ratio = counters["cached_tokens"] / counters["prompt_tokens"]
    shown = next(
        line for line in metrics.splitlines() if line.startswith("keeper_proxy_cached_ratio{")
    )
    assert abs(float(shown.split()[-1]) - ratio) < 1e-9
    assert info["counters"]["cuts"] >= 1 and info["archive_turns"] > 0
    assert info["notes"].startswith("[NOTES]")
    assert info["proxy"]["upstream_calls"] == len(upstream.requests)
    assert info["proxy"]["added_seconds"] >= 0
    await app.state.proxy.aclose()
