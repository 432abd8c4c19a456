"""What a run cost: time, model calls, tokens, the window's peak, and prefix-cache reuse.

Pure: a run records one ``CallRecord`` per model call (``calls.jsonl`` in a run folder, one JSON
object per line with the fields below), and ``summarize_costs`` turns them into the figures the
reports print. Prefix reuse is exact: each call carries a fingerprint, one hash for the tools and
system prompt first (they render first in a chat template), then one hash per message in order,
so "how many leading messages were identical to the previous call" needs no tokenizer.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
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


def segment_count(total_tokens: int, width: int) -> int:
    """Whole segments of ``width``, a tail of less than half a width joining the last one: a
    run that ends a few thousand tokens past a round number (its final questions) would
    otherwise get a sliver of a segment whose rate per 100K is that sliver's calls blown up."""
    whole, rest = divmod(total_tokens, width)
    return max(1, whole + (1 if 2 * rest >= width else 0))


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
    """The slice of history this segment covers (see `segment_width` and `segment_count`: the
    last is between half a width and one and a half)."""
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


class _SegmentTally:
    """Minutes and tokens per slice of history (`segment_width` of the run's total), added up
    one record at a time."""

    def __init__(self, history_tokens_by_item: Mapping[int, int]) -> None:
        self.items = sorted(history_tokens_by_item)
        self.by_item = history_tokens_by_item
        total = history_tokens_by_item[self.items[-1]] if self.items else 0
        self.total = total
        self.width = segment_width(total)
        self.count = segment_count(total, self.width) if self.items else 0
        self.minutes = [0.0] * self.count
        self.spent = [0] * self.count

    def add(self, record: CallRecord) -> None:
        if not self.items:
            return
        index = bisect_right(self.items, record.item) - 1
        history = self.by_item[self.items[index]] if index >= 0 else 0
        segment = min(self.count - 1, history // self.width)
        self.minutes[segment] += record.wall_seconds / 60
        self.spent[segment] += record.prompt_tokens + record.completion_tokens

    def segments(self) -> tuple[Segment, ...]:
        width = self.width
        return tuple(
            Segment(
                i * width,
                self.total if i == self.count - 1 else (i + 1) * width,
                self.minutes[i],
                self.spent[i],
            )
            for i in range(self.count)
        )


def summarize_costs(
    records: Iterable[CallRecord], history_tokens_by_item: Mapping[int, int]
) -> CostSummary:
    """The cost figures of one run; ``history_tokens_by_item`` maps item → history tokens so far.

    A sequence is put in call order first; any other iterable (a run's calls.jsonl, read line by
    line) is taken in the order given, which is call order, one record at a time, so a run of
    any length is summed in constant memory.
    """
    ordered: Iterable[CallRecord] = (
        sorted(records, key=lambda r: r.index) if isinstance(records, Sequence) else records
    )
    tally = _SegmentTally(history_tokens_by_item)
    calls = work = reused = entries = reused_tokens = 0
    wall = model = 0.0
    prompt = completion = cached = cached_calls = management = peak = 0
    prev: CallRecord | None = None
    for record in ordered:
        calls += 1
        work += record.kind == "work"
        if record.kind != "work":
            management += record.prompt_tokens + record.completion_tokens
        if prev is not None:
            reuse = prefix_reuse(prev, record)
            reused += reuse.messages
            reused_tokens += reuse.tokens_estimate
            entries += len(record.request_fingerprint)
        if record.cached_tokens is not None:
            cached += record.cached_tokens
            cached_calls += 1
        wall += record.wall_seconds
        model += record.model_seconds
        prompt += record.prompt_tokens
        completion += record.completion_tokens
        peak = max(peak, record.prompt_tokens)
        tally.add(record)
        prev = record
    return CostSummary(
        wall_seconds=wall,
        model_seconds=model,
        calls=calls,
        work_calls=work,
        management_calls=calls - work,
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_tokens=cached,
        cached_reported_calls=cached_calls,
        management_tokens=management,
        peak_prompt_tokens=peak,
        prefix_reuse_ratio=reused / entries if entries else 0.0,
        prefix_reuse_tokens=reused_tokens,
        segments=tally.segments(),
    )
