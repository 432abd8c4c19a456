"""What a run cost: time, model calls, tokens, the window's peak, and prefix-cache reuse.

Pure: a run records one ``CallRecord`` per model call (``calls.jsonl`` in a run folder, one JSON
object per line with the fields below), and ``summarize_costs`` turns them into the figures the
reports print. Prefix reuse is exact: each call carries a fingerprint, one hash for the tools and
system prompt first (they render first in a chat template), then one hash per message in order,
so "how many leading messages were identical to the previous call" needs no tokenizer.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from typing import Any

SEGMENT_TOKENS = 100_000
"""Rates are per this many tokens of history, whatever the width of a segment."""
SEGMENT_WIDTHS = (1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000)
MIN_SEGMENTS = 8


def segment_width(total_tokens: int) -> int:
    """The widest round slice of history that still cuts ``total_tokens`` into at least
    ``MIN_SEGMENTS`` segments (100K at 1M tokens, 20K at 240K), so a plot of a small run has
    a curve rather than one point; the narrowest when even that gives fewer."""
    fitting = [w for w in SEGMENT_WIDTHS if total_tokens // w >= MIN_SEGMENTS]
    return max(fitting) if fitting else SEGMENT_WIDTHS[0]


@dataclass(frozen=True, slots=True, kw_only=True)
class CallRecord:
    index: int
    kind: str
    """"work" for the agent's own calls; "notes", "reask", "summary", ... for management."""
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None
    """From the server's usage report; None when the server does not say."""
    request_fingerprint: tuple[str, ...]
    wall_seconds: float
    model_seconds: float
    item: int
    """The last item the run had reached when it made this call."""

    def __post_init__(self) -> None:
        if self.prompt_tokens < 0 or self.completion_tokens < 0:
            raise ValueError(f"call {self.index}: token counts cannot be negative")
        if not self.kind:
            raise ValueError(
                f"call {self.index}: kind must say what the call was for, e.g. 'work' or 'notes'"
            )

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["request_fingerprint"] = list(self.request_fingerprint)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CallRecord:
        return cls(**{**data, "request_fingerprint": tuple(data["request_fingerprint"])})


@dataclass(frozen=True, slots=True)
class PrefixReuse:
    messages: int
    """Leading fingerprint entries (tools/system, then messages) identical to the previous call."""
    tokens_estimate: int
    """The previous prompt's tokens, pro rata to the share of its entries that were reused."""


def prefix_reuse(prev: CallRecord, cur: CallRecord) -> PrefixReuse:
    shared = 0
    for left, right in zip(prev.request_fingerprint, cur.request_fingerprint, strict=False):
        if left != right:
            break
        shared += 1
    entries = len(prev.request_fingerprint)
    tokens = round(prev.prompt_tokens * shared / entries) if entries else 0
    return PrefixReuse(shared, tokens)


@dataclass(frozen=True, slots=True)
class Segment:
    start_tokens: int
    end_tokens: int
    """The slice of history this segment covers (see `segment_width`; the last may be shorter)."""
    minutes: float
    tokens_spent: int
    """Prompt + completion tokens of the calls made while the history was in this slice."""

    @property
    def minutes_per_100k(self) -> float:
        width = self.end_tokens - self.start_tokens
        return self.minutes * SEGMENT_TOKENS / width if width else 0.0

    @property
    def tokens_per_100k(self) -> float:
        width = self.end_tokens - self.start_tokens
        return self.tokens_spent * SEGMENT_TOKENS / width if width else 0.0


@dataclass(frozen=True, slots=True)
class CostSummary:
    wall_seconds: float
    model_seconds: float
    calls: int
    work_calls: int
    management_calls: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    cached_reported_calls: int
    management_tokens: int
    peak_prompt_tokens: int
    prefix_reuse_ratio: float
    """Reused leading entries / all entries, over every call after the first."""
    prefix_reuse_tokens: int
    segments: tuple[Segment, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["segments"] = [
            {
                **asdict(s),
                "minutes_per_100k": s.minutes_per_100k,
                "tokens_per_100k": s.tokens_per_100k,
            }
            for s in self.segments
        ]
        return data


def _segments(
    records: Sequence[CallRecord], history_tokens_by_item: Mapping[int, int]
) -> tuple[Segment, ...]:
    if not history_tokens_by_item:
        return ()
    items = sorted(history_tokens_by_item)
    total = history_tokens_by_item[items[-1]]
    width = segment_width(total)
    count = max(1, -(-total // width))
    minutes = [0.0] * count
    spent = [0] * count

    def history_at(item: int) -> int:
        index = bisect_right(items, item) - 1
        return history_tokens_by_item[items[index]] if index >= 0 else 0

    for record in records:
        segment = min(count - 1, history_at(record.item) // width)
        minutes[segment] += record.wall_seconds / 60
        spent[segment] += record.prompt_tokens + record.completion_tokens
    return tuple(
        Segment(i * width, min(total, (i + 1) * width), minutes[i], spent[i]) for i in range(count)
    )


def summarize_costs(
    records: Sequence[CallRecord], history_tokens_by_item: Mapping[int, int]
) -> CostSummary:
    """The cost figures of one run; ``history_tokens_by_item`` maps item → history tokens so far."""
    ordered = sorted(records, key=lambda r: r.index)
    work = [r for r in ordered if r.kind == "work"]
    management = [r for r in ordered if r.kind != "work"]
    reused = entries = reused_tokens = 0
    for prev, cur in pairwise(ordered):
        reuse = prefix_reuse(prev, cur)
        reused += reuse.messages
        reused_tokens += reuse.tokens_estimate
        entries += len(cur.request_fingerprint)
    cached = [r.cached_tokens for r in ordered if r.cached_tokens is not None]
    return CostSummary(
        wall_seconds=sum(r.wall_seconds for r in ordered),
        model_seconds=sum(r.model_seconds for r in ordered),
        calls=len(ordered),
        work_calls=len(work),
        management_calls=len(management),
        prompt_tokens=sum(r.prompt_tokens for r in ordered),
        completion_tokens=sum(r.completion_tokens for r in ordered),
        cached_tokens=sum(cached),
        cached_reported_calls=len(cached),
        management_tokens=sum(r.prompt_tokens + r.completion_tokens for r in management),
        peak_prompt_tokens=max((r.prompt_tokens for r in ordered), default=0),
        prefix_reuse_ratio=reused / entries if entries else 0.0,
        prefix_reuse_tokens=reused_tokens,
        segments=_segments(ordered, history_tokens_by_item),
    )
