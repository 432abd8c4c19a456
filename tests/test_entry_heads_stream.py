"""The ``entry_heads`` family: the same stream with "Entry N." heads, which the product's default
item pattern does not match, read by the simulated reader exactly as the "Item N." stream."""

from __future__ import annotations

import json
import re
from pathlib import Path

from keeper_bench.run_options import RunOptions, resolve_stream
from keeper_bench.runner import run_arm
from keeper_bench.streams import read_stream
from keeper_middleware.config import KeeperConfig


def _records(folder: Path) -> list[dict]:
    return list(read_stream(folder))


def test_only_the_heads_differ_and_the_default_item_pattern_matches_none(tmp_path):
    items = resolve_stream("tiny:rules", tmp_path / "items")
    entries = resolve_stream("tiny:rules+entry_heads", tmp_path / "entries")
    pattern = KeeperConfig().item_pattern
    assert pattern is not None
    default_heads = re.compile(pattern, re.MULTILINE)
    plain, headed = _records(items), _records(entries)
    assert len(plain) == len(headed)
    for a, b in zip(plain, headed, strict=True):
        if a["type"] != "batch":
            assert a == b  # questions, rules: the same
            continue
        assert a["text"].startswith(f"Item {a['item']}.")
        assert b["text"] == a["text"].replace(f"Item {a['item']}.", f"Entry {a['item']}.", 1)
        assert default_heads.search(a["text"]) and not default_heads.search(b["text"])


def test_the_reader_reads_entry_heads_as_item_heads(tmp_path):
    scores = {}
    for family in ("rules", "rules+entry_heads"):
        stream = resolve_stream(f"tiny:{family}", tmp_path / family / "stream")
        options = RunOptions.create(arm="window_drop", stream=stream, window=4096)
        run_arm(options, tmp_path / family / "run", progress=False)
        scores[family] = json.loads((tmp_path / family / "run" / "grade.json").read_text())
    plain, headed = scores["rules"], scores["rules+entry_heads"]
    assert plain["asked"] == headed["asked"] and plain["right"] > 0
    assert [q["given"] for q in plain["scored"]] == [q["given"] for q in headed["scored"]]


def test_the_self_editing_arms_count_in_the_learned_head_as_the_keeper_does(tmp_path):
    """The benchmark's self-editing arms number inputs with the product's numbering, the learned
    head included: on "Entry N." heads they answer as on "Item N." heads."""
    given = {}
    for family in ("rules", "rules+entry_heads"):
        stream = resolve_stream(f"tiny:{family}", tmp_path / family / "stream")
        options = RunOptions.create(arm="self_edit_rules", stream=stream, window=4096)
        run_arm(options, tmp_path / family / "run", progress=False)
        grade = json.loads((tmp_path / family / "run" / "grade.json").read_text())
        given[family] = [q["given"] for q in grade["scored"]]
    assert given["rules"] == given["rules+entry_heads"]
