"""Costs: exact prefix reuse from fingerprints, and time per 100K tokens of history by segment."""

from __future__ import annotations

import json
from itertools import pairwise

import pytest

from keeper_bench.costs import (
    MIN_SEGMENTS,
    SEGMENT_TOKENS,
    SEGMENT_WIDTHS,
    CallRecord,
    prefix_reuse,
    segment_width,
    summarize_costs,
)


def _call(
    index,
    kind="work",
    *,
    fp=("tools", "sys"),
    prompt=1_000,
    completion=100,
    cached=None,
    wall=60.0,
    item=1,
):
    return CallRecord(
        index=index,
        kind=kind,
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_tokens=cached,
        request_fingerprint=tuple(fp),
        wall_seconds=wall,
        model_seconds=wall / 2,
        item=item,
    )


def test_prefix_reuse_counts_the_leading_identical_entries():
    prev = _call(0, fp=("tools", "a", "b", "c"), prompt=4_000)
    cur = _call(1, fp=("tools", "a", "b", "x", "y"))
    assert prefix_reuse(prev, cur).messages == 3
    assert prefix_reuse(prev, cur).tokens_estimate == 3_000


def test_changed_tools_reuse_nothing():
    prev = _call(0, fp=("tools", "a"))
    cur = _call(1, fp=("other tools", "a"))
    assert prefix_reuse(prev, cur).messages == 0


def test_a_summary_separates_work_from_management():
    records = [
        _call(0, fp=("t", "a"), prompt=1_000, cached=0),
        _call(1, "notes", fp=("t", "a", "b"), prompt=3_000, completion=500, cached=900),
        _call(2, fp=("t", "n"), prompt=800),
    ]
    summary = summarize_costs(records, {1: 50_000})
    assert (summary.calls, summary.work_calls, summary.management_calls) == (3, 2, 1)
    assert summary.prompt_tokens == 4_800 and summary.completion_tokens == 700
    assert summary.management_tokens == 3_500
    assert summary.cached_tokens == 900 and summary.cached_reported_calls == 2
    assert summary.peak_prompt_tokens == 3_000
    assert summary.prefix_reuse_ratio == pytest.approx((2 + 1) / (3 + 2))
    assert summary.wall_seconds == 180


def test_minutes_per_100k_tokens_of_history_by_segment():
    history = {1: 400_000, 2: 1_200_000, 3: 2_500_000}
    records = [_call(0, item=1), _call(1, item=2), _call(2, item=2), _call(3, item=3)]
    segments = summarize_costs(records, history).segments
    assert len(segments) == 25
    assert (segments[0].start_tokens, segments[0].end_tokens) == (0, 100_000)
    assert segments[-1].end_tokens == 2_500_000
    by_minutes = {s.start_tokens: s.minutes for s in segments if s.minutes}
    assert by_minutes == {400_000: 1.0, 1_200_000: 2.0, 2_400_000: 1.0}
    assert segments[-1].minutes_per_100k == pytest.approx(1.0)


@pytest.mark.parametrize("total", [5_000, 60_000, 240_000, 1_000_000, 10_000_000])
def test_every_size_gets_several_segments_that_tile_the_history(total):
    history = {1: total // 2, 2: total}
    segments = summarize_costs([_call(0, item=1), _call(1, item=2)], history).segments
    assert len(segments) >= min(MIN_SEGMENTS, total // SEGMENT_WIDTHS[0])
    assert segments[0].start_tokens == 0 and segments[-1].end_tokens == total
    assert all(a.end_tokens == b.start_tokens for a, b in pairwise(segments))
    assert segment_width(total) <= SEGMENT_TOKENS


@pytest.mark.parametrize("tail", [1, 3_000, 49_999])
def test_a_short_tail_joins_the_last_segment_instead_of_making_a_sliver(tail):
    # the final questions come a few thousand tokens past the round size: their calls must be
    # spread over a segment's worth of history, not blown up by a sliver's width
    total = 1_000_000 + tail
    history = {1: 950_000, 2: total}
    segments = summarize_costs([_call(0, item=1), _call(1, item=2)], history).segments
    assert len(segments) == 10
    assert (segments[-1].start_tokens, segments[-1].end_tokens) == (900_000, total)
    assert segments[-1].minutes == 2.0
    assert segments[-1].minutes_per_100k == pytest.approx(2.0 * 100_000 / (100_000 + tail))


def test_a_tail_of_half_a_segment_or_more_is_a_segment_of_its_own():
    total = 1_050_000
    segments = summarize_costs([_call(0, item=1)], {1: total}).segments
    assert len(segments) == 11
    assert (segments[-1].start_tokens, segments[-1].end_tokens) == (1_000_000, total)


def test_rates_are_per_100k_tokens_whatever_the_segment_width():
    small = summarize_costs([_call(0, item=1)], {1: 20_000}).segments
    width = small[0].end_tokens - small[0].start_tokens
    assert small[0].minutes_per_100k == pytest.approx(small[0].minutes * 100_000 / width)


def test_no_history_gives_no_segments_and_no_calls_give_zeros():
    summary = summarize_costs([], {})
    assert summary.segments == () and summary.calls == 0 and summary.prefix_reuse_ratio == 0


def test_a_call_record_survives_json_and_refuses_nonsense():
    record = _call(4, "reask", fp=("t", "a"))
    assert CallRecord.from_json(json.loads(json.dumps(record.to_json()))) == record
    with pytest.raises(ValueError, match="negative"):
        _call(5, prompt=-1)
    with pytest.raises(ValueError, match="kind"):
        _call(6, kind="")


def test_a_run_read_one_call_at_a_time_sums_to_the_same_figures():
    calls = [
        _call(i, "notes" if i % 4 == 0 else "work", fp=("tools", "a", str(i)), item=i // 2)
        for i in range(40)
    ]
    history = {item: item * 30_000 for item in range(25)}
    assert summarize_costs(iter(calls), history) == summarize_costs(calls, history)


def test_a_recorder_with_a_sink_hands_each_call_on_and_keeps_none_in_memory():
    from uuid import uuid4

    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.outputs import ChatGeneration, LLMResult

    from keeper_bench.recording import CallRecorder

    sunk: list[CallRecord] = []
    with_sink, without = CallRecorder(sink=sunk.append), CallRecorder()
    for recorder in (with_sink, without):
        for n in range(3):
            run_id = uuid4()
            recorder.on_chat_model_start({}, [[HumanMessage(f"item {n}")]], run_id=run_id)
            reply = ChatGeneration(message=AIMessage("ok"))
            recorder.on_llm_end(LLMResult(generations=[[reply]]), run_id=run_id)
    assert [r.index for r in sunk] == [0, 1, 2] and with_sink.records == []
    assert [r.index for r in without.records] == [0, 1, 2]
