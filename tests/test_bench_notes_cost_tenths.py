"""The cost table's tenths are tenths of the stream; the final questions, asked after its last
token, are a row of their own, and splitting them off moves cost without losing or adding any."""

from __future__ import annotations

import json
import random

import pytest

from keeper_bench.costs import CallRecord
from keeper_bench.notes_cost.command import main
from keeper_bench.notes_cost.tenths import (
    TENTHS,
    Mark,
    StreamEnd,
    attribute,
    calls_in_first_bytes,
)


def _call(index: int, item: int, prompt: int, fingerprint: tuple[str, ...]) -> CallRecord:
    return CallRecord(
        index=index,
        kind="work",
        prompt_tokens=prompt,
        completion_tokens=10,
        cached_tokens=None,
        request_fingerprint=fingerprint,
        wall_seconds=0.0,
        model_seconds=0.0,
        item=item,
    )


def _stream_run(seed: int, items: int) -> tuple[list[CallRecord], dict[int, int], list[Mark], int]:
    """A run of ``items`` batches, each a call or two, then final questions after the last."""
    rng = random.Random(seed)
    by_item, calls, marks = {}, [], []
    history, cpu, prefix = 0, 0.0, ("system",)
    for item in range(1, items + 1):
        history += rng.randint(500, 1500)
        by_item[item] = history
        for _ in range(rng.randint(1, 2)):
            prefix = (*prefix, f"m{len(calls)}") if rng.random() < 0.8 else ("system", "notes")
            calls.append(_call(len(calls), item, rng.randint(2000, 9000), prefix))
        cpu += rng.uniform(0.001, 0.01)
        marks.append(Mark(history_tokens=history, keeper_cpu_s=cpu, after_stream=False))
    before = len(calls)
    by_item[items] = history + 300  # the final questions' text, recorded at the last item
    for _ in range(rng.randint(1, 6)):
        prefix = (*prefix, f"q{len(calls)}")
        calls.append(_call(len(calls), items, rng.randint(2000, 9000), prefix))
    cpu += rng.uniform(0.01, 0.05)
    marks.append(Mark(history_tokens=history + 300, keeper_cpu_s=cpu, after_stream=True))
    return calls, by_item, marks, before


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("items", [12, 90, 400])
def test_the_final_questions_are_counted_once_in_their_own_row(seed, items):
    calls, by_item, marks, before = _stream_run(seed, items)
    end = StreamEnd(tokens=marks[-2].history_tokens, calls=before)
    split = attribute(calls, by_item, marks, end)
    folded = attribute(calls, by_item, marks, None)

    final = calls[before:]
    assert split.after["calls"] == len(final)
    assert split.after["prompt"] == sum(call.prompt_tokens for call in final)
    assert split.after["keeper_cpu_s"] == pytest.approx(
        marks[-1].keeper_cpu_s - marks[-2].keeper_cpu_s
    )
    in_tenths = sum(row["prompt"] for row in split.tenths)
    assert in_tenths == sum(call.prompt_tokens for call in calls[:before])
    # nothing is lost or counted twice: the same totals, split or folded, and the old figure kept
    for key in ("prompt", "uncached", "keeper_cpu_s"):
        assert split.totals()[key] == pytest.approx(folded.totals()[key])
        assert sum(row[key] for row in split.folded) == pytest.approx(folded.totals()[key])
    assert folded.after["calls"] == 0
    assert len(split.tenths) == len(split.folded) == TENTHS
    assert split.width * TENTHS == end.tokens  # tenths of the stream, not of its final questions


def test_a_stream_end_is_a_size_and_a_count():
    with pytest.raises(ValueError, match="never negative"):
        StreamEnd(tokens=-1, calls=0)


def test_the_calls_before_the_end_are_counted_from_the_file_size(tmp_path):
    path = tmp_path / "calls.jsonl"
    lines = [json.dumps({"index": n, "text": "ü" * n}) + "\n" for n in range(5)]
    path.write_text("".join(lines), encoding="utf-8")
    size = sum(len(line.encode("utf-8")) for line in lines[:3])
    assert calls_in_first_bytes(path, size) == 3
    assert calls_in_first_bytes(path, 0) == 0
    assert calls_in_first_bytes(tmp_path / "missing.jsonl", 100) == 0


@pytest.mark.parametrize("seed", [0, 4])
def test_a_run_reports_the_final_questions_after_the_stream(tmp_path, seed, capsys):
    work = tmp_path / "work"
    out = tmp_path / "notes_cost.md"
    assert (
        main(["--sizes", "tiny", "--seed", str(seed), "--work", str(work), "--out", str(out)]) == 0
    )
    folder = work / f"harder-tiny-seed{seed}"
    result = json.loads((folder / "result.json").read_text(encoding="utf-8"))
    end = json.loads((folder / "run" / "stream_end.json").read_text(encoding="utf-8"))
    calls = [line for line in (folder / "run" / "calls.jsonl").read_text().splitlines() if line]
    after = result["after_stream"]
    assert 0 < end["calls"] < len(calls)
    assert after["calls"] == len(calls) - end["calls"]
    prompts = [json.loads(line)["prompt_tokens"] for line in calls]
    assert after["prompt"] == sum(prompts[end["calls"] :])
    assert result["totals"]["prompt"] == sum(prompts)
    table = out.read_text(encoding="utf-8")
    assert "| after the stream (" in table
    assert "| old figure: tenth 10 with the final questions in it |" in table
    capsys.readouterr()
    assert main(["--explain", str(work)]) == 0
    explained = capsys.readouterr().out
    assert explained.count("| after the stream |") == 1


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("items", [12, 90, 400])
def test_each_phase_is_split_like_the_keeper_cpu_and_none_is_lost(seed, items):
    rng = random.Random(seed)
    calls, by_item, plain, before = _stream_run(seed, items)
    names = ("prepare", "commit", "search")
    so_far = dict.fromkeys(names, 0.0)
    marks = []
    for mark in plain:
        for name in names:
            so_far[name] += rng.uniform(0.0, 0.01)
        marks.append(
            Mark(
                history_tokens=mark.history_tokens,
                keeper_cpu_s=sum(so_far.values()),
                after_stream=mark.after_stream,
                phases=dict(so_far),
            )
        )
    end = StreamEnd(tokens=plain[-2].history_tokens, calls=before)
    split = attribute(calls, by_item, marks, end)
    assert len(split.phase_tenths) == TENTHS
    for phases, tenth in zip(split.phase_tenths, split.tenths, strict=True):
        assert sum(phases.values()) == pytest.approx(tenth["keeper_cpu_s"])
    assert sum(split.phase_after.values()) == pytest.approx(split.after["keeper_cpu_s"])
    for name in names:
        spent = sum(row[name] for row in split.phase_tenths) + split.phase_after[name]
        assert spent == pytest.approx(so_far[name])


def test_marks_without_phases_leave_no_phase_figures():
    calls, by_item, marks, before = _stream_run(4, 30)
    split = attribute(calls, by_item, marks, StreamEnd(tokens=1, calls=before))
    assert split.phase_tenths == [] and split.phase_after == {}
