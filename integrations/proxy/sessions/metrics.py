"""The proxy's counters: what it adds to the keeper's, per session, and ``/metrics``.

Counters are kept per session (persisted with the session, so they survive a restart) and
exported with ``prometheus_client``: one series per metric and tenant (and per session only when
asked for), never a total next to its parts, so ``sum()`` is right. Session ids are left out by
default because they can carry what users typed into a client.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

__all__ = [
    "KEEPER_METRICS",
    "PROXY_METRICS",
    "SLOT_METRICS",
    "ProxyStats",
    "SessionCounters",
    "metrics_registry",
]


@dataclass(slots=True)
class ProxyStats:
    """What the proxy adds to the keeper's counters, per session (persisted as JSON)."""

    requests: int = 0
    """Chat requests answered or failed (refused ones are not stored at all)."""
    upstream_calls: int = 0
    """Every upstream chat call: work, notes, re-asks, each try counted once."""
    upstream_retries: int = 0
    """Tries repeated after an error, a 429 or a timeout."""
    upstream_failures: int = 0
    """Tries that failed (each one, whether a retry then succeeded or not)."""
    failed_requests: int = 0
    """Requests answered with an upstream error after the retries ran out."""
    search_rounds: int = 0
    """Upstream replies whose archive searches the proxy answered and called again for."""
    loop_limit_hits: int = 0
    withdrawn_messages: int = 0
    returned_messages: int = 0
    """Withdrawn messages sent again and recognised by content."""
    stored_bytes: int = 0
    """Bytes of agent messages and replies this session stored (counts toward the quota)."""
    upstream_seconds: float = 0.0
    backoff_seconds: float = 0.0
    """Time spent waiting between upstream tries (backoff, or what a ``Retry-After`` asked)."""
    added_seconds: float = 0.0
    """Time the proxy added: request time minus time spent waiting for the upstream and
    between its tries."""

    def to_json(self) -> dict[str, Any]:
        # read in one C call: a request saves them once, with its record
        return dict(zip(_STATS_FIELDS, _read_stats(self), strict=True))

    @classmethod
    def from_json(cls, data: object) -> ProxyStats:
        if not isinstance(data, dict):
            return cls()
        values: dict[str, Any] = {}
        for spec in fields(cls):
            if spec.name in data:
                kind = float if spec.type == "float" else int
                values[spec.name] = kind(data[spec.name])
        return cls(**values)


_STATS_FIELDS = tuple(spec.name for spec in fields(ProxyStats))
_read_stats = operator.attrgetter(*_STATS_FIELDS)

KEEPER_METRICS = (
    ("model_calls", "counter", "Work calls made for the agent."),
    ("notes_calls", "counter", "Note-taking calls (first asks and re-asks)."),
    ("cuts", "counter", "Cuts: turns moved to the archive and NOTES updated."),
    ("reasks", "counter", "Note replies asked for again after a failed check."),
    ("thinking_retries", "counter", "Replies that thought to their limit, asked again."),
    ("searches", "counter", "Archive searches run."),
    ("search_refusals", "counter", "Archive searches refused by the loop guards."),
    ("prompt_tokens", "counter", "Prompt tokens the upstream reported."),
    ("cached_tokens", "counter", "Prompt tokens the upstream served from its prefix cache."),
    ("completion_tokens", "counter", "Completion tokens the upstream reported."),
    ("management_prompt_tokens", "counter", "Prompt tokens spent on note-taking."),
    ("notes_tokens", "gauge", "Tokens of the NOTES as last written, summed over sessions."),
    ("archive_turns", "gauge", "Turns in the archive."),
    ("peak_window", "gauge", "Largest request sent, in tokens (the largest over sessions)."),
)
PROXY_METRICS = (
    ("requests", "counter", "Chat requests answered or failed."),
    ("upstream_calls", "counter", "Upstream chat calls (every try)."),
    ("upstream_retries", "counter", "Upstream tries repeated after a failure."),
    ("upstream_failures", "counter", "Upstream tries that failed."),
    ("failed_requests", "counter", "Requests that failed on the upstream."),
    ("search_rounds", "counter", "Replies whose searches the proxy answered."),
    ("loop_limit_hits", "counter", "Requests that hit the upstream call limit."),
    ("withdrawn_messages", "counter", "Agent messages withdrawn by edits or resends."),
    ("returned_messages", "counter", "Withdrawn agent messages sent again."),
    ("stored_bytes", "gauge", "Bytes of messages stored."),
    ("upstream_seconds", "counter", "Seconds spent waiting for the upstream."),
    ("backoff_seconds", "counter", "Seconds spent waiting between upstream tries."),
    ("added_seconds", "counter", "Seconds the proxy added beyond the upstream's time."),
)


@dataclass(frozen=True, slots=True)
class SessionCounters:
    """One session's figures as ``/metrics`` reads them."""

    tenant: str
    session: str
    keeper: dict[str, Any]
    proxy: dict[str, Any]


class _SessionsCollector(Collector):  # type: ignore[misc]
    """Reads every session's counters at scrape time (they live with the sessions)."""

    def __init__(self, read: Callable[[], Iterable[SessionCounters]], per_session: bool) -> None:
        self.read = read
        self.per_session = per_session

    def collect(self) -> Iterator[Metric]:
        labels = ["tenant", "session"] if self.per_session else ["tenant"]
        groups: dict[tuple[str, ...], dict[str, float]] = {}
        per_tenant: dict[str, int] = {}
        for row in self.read():
            per_tenant[row.tenant] = per_tenant.get(row.tenant, 0) + 1
            key: tuple[str, ...] = (row.tenant, row.session) if self.per_session else (row.tenant,)
            group = groups.setdefault(key, {})
            for name, value in (*row.keeper.items(), *row.proxy.items()):
                if isinstance(value, int | float) and not isinstance(value, bool):
                    if name == "peak_window":
                        group[name] = max(group.get(name, 0.0), float(value))
                    else:
                        group[name] = group.get(name, 0.0) + float(value)
        for name, kind, help_text in (*KEEPER_METRICS, *PROXY_METRICS):
            family: CounterMetricFamily | GaugeMetricFamily
            if kind == "counter":
                family = CounterMetricFamily(f"keeper_proxy_{name}", help_text, labels=labels)
            else:
                family = GaugeMetricFamily(f"keeper_proxy_{name}", help_text, labels=labels)
            for key, group in sorted(groups.items()):
                family.add_metric(list(key), group.get(name, 0.0))
            yield family
        ratio = GaugeMetricFamily(
            "keeper_proxy_cached_ratio",
            "Share of prompt tokens served from the prefix cache.",
            labels=labels,
        )
        for key, group in sorted(groups.items()):
            prompt = group.get("prompt_tokens", 0.0)
            ratio.add_metric(list(key), group.get("cached_tokens", 0.0) / prompt if prompt else 0.0)
        yield ratio
        sessions = GaugeMetricFamily("keeper_proxy_sessions", "Sessions stored.", labels=["tenant"])
        for tenant, count in sorted(per_tenant.items()):
            sessions.add_metric([tenant], count)
        yield sessions


SLOT_METRICS = (
    ("parks", "counter", "Session KV caches saved to disk to free a server slot."),
    ("park_failures", "counter", "Saves that failed (the session is re-read later)."),
    ("restores", "counter", "Parked caches restored into a slot before a request."),
    ("partial_restores", "counter", "Restores whose cache only partly starts the request."),
    ("pruned", "counter", "Parked files deleted to stay within the disk budget."),
    ("erased", "counter", "Slots erased (a forgotten session, a failed restore)."),
    ("park_seconds", "counter", "Seconds spent saving slots."),
    ("restore_seconds", "counter", "Seconds spent restoring slots."),
    ("prompt_tokens_read", "counter", "Prompt tokens the server read on pinned calls."),
    ("prompt_tokens_reused", "counter", "Prompt tokens the server did not have to read."),
    ("tokens_spared_by_restores", "counter", "Of those, on the first call after a restore."),
    ("parked_bytes", "gauge", "Bytes of parked KV caches on disk."),
    ("parked_sessions", "gauge", "Sessions with a parked KV cache on disk."),
)


class _SlotsCollector(Collector):  # type: ignore[misc]
    """The slot parking's counters (one server's slots, shared by every tenant)."""

    def __init__(self, read: Callable[[], Mapping[str, Any]]) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        values = self.read()
        for name, kind, help_text in SLOT_METRICS:
            family: CounterMetricFamily | GaugeMetricFamily
            if kind == "counter":
                family = CounterMetricFamily(f"keeper_proxy_slot_{name}", help_text)
            else:
                family = GaugeMetricFamily(f"keeper_proxy_slot_{name}", help_text)
            family.add_metric([], float(values.get(name, 0)))
            yield family
        refusals = CounterMetricFamily(
            "keeper_proxy_slot_refusals",
            "Parked caches not restored (the session was re-read), by reason.",
            labels=["reason"],
        )
        for reason, count in sorted(dict(values.get("refusals", {})).items()):
            refusals.add_metric([reason], float(count))
        yield refusals


def metrics_registry(
    read: Callable[[], Iterable[SessionCounters]],
    *,
    per_session: bool = False,
    slots: Callable[[], Mapping[str, Any]] | None = None,
) -> CollectorRegistry:
    """A registry of its own per proxy app (so two apps in one process do not clash); with
    ``slots``, the slot parking's counters too."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SessionsCollector(read, per_session))
    if slots is not None:
        registry.register(_SlotsCollector(slots))
    return registry
