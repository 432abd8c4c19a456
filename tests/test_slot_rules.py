"""The pure rules of slot parking: names, identity refusals, the prefix check, LRU pruning."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keeper_middleware.integrations.proxy.slots.rules import (
    ParkedFile,
    ServerIdentity,
    common_prefix,
    parked_name,
    prefix_decision,
    prompt_counts,
    prune_plan,
    read_cached_tokens,
    refusal_reason,
)

BASE = ServerIdentity(
    build="b7000-abc",
    model_path="/models/smol.gguf",
    model_fingerprint="98362432:aa",
    architecture="vocab_type=2,n_vocab=49152,n_params=134515008,n_embd=576",
    model_bytes=98_000_000,
    ctx_per_slot=8192,
    slots=1,
)


# ---------------------------------------------------------------- names


@given(st.text(min_size=1, max_size=300), st.text(min_size=1, max_size=300))
def test_a_parked_name_is_a_safe_file_name_whatever_the_session_id(tenant, session):
    name = parked_name(f"{tenant}:{session}")
    assert name.startswith("kv-") and name.endswith(".bin")
    assert set(name) <= set("kv-0123456789abcdef.bin")
    assert "/" not in name and ".." not in name and len(name) < 80


def test_names_differ_per_tenant_and_session_and_group_by_tenant():
    names = {parked_name(f"{t}:{s}") for t in ("acme", "zeta") for s in ("one", "two", "../x")}
    assert len(names) == 6
    acme = [n for n in names if n.startswith(parked_name("acme:other")[:16])]
    assert len(acme) == 3
    assert parked_name("acme:one") == parked_name("acme:one")


# ---------------------------------------------------------------- identity


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"build": "b7001-def"}, "build"),
        ({"architecture": "vocab_type=2,n_vocab=32000,n_params=7e9,n_embd=4096"}, "model"),
        ({"model_bytes": 120_000_000, "model_fingerprint": "120000000:bb"}, "quantisation"),
        ({"quantisation": "Q8_0"}, "quantisation"),
        ({"model_fingerprint": "98362432:cc"}, "model"),
        ({"ctx_per_slot": 4096}, "context"),
        ({"slots": 2}, "slots"),
    ],
)
def test_a_cache_is_refused_when_what_made_it_differs(change, reason):
    now = ServerIdentity(**{**BASE.to_json(), **change})
    assert refusal_reason(BASE, now) == reason


def test_the_same_server_and_a_moved_model_file_are_accepted():
    assert refusal_reason(BASE, BASE) is None
    moved = ServerIdentity(**{**BASE.to_json(), "model_path": "/elsewhere/smol.gguf"})
    assert refusal_reason(BASE, moved) is None


def test_without_fingerprints_the_model_path_decides():
    saved = ServerIdentity(**{**BASE.to_json(), "model_fingerprint": ""})
    other = ServerIdentity(**{**saved.to_json(), "model_path": "/models/other.gguf"})
    assert refusal_reason(saved, other) == "model"


def test_identity_survives_its_sidecar_and_reads_llama_server_replies():
    assert ServerIdentity.from_json(BASE.to_json()) == BASE
    props = {
        "build_info": "b7000-abc",
        "model_path": "/models/smol.gguf",
        "total_slots": 2,
        "default_generation_settings": {"n_ctx": 4096},
    }
    meta = {"n_vocab": 49152, "size": 98_000_000, "ftype": "Q4_1"}
    models = {"data": [{"id": "smol", "meta": meta}]}
    read = ServerIdentity.from_server(props, models, "fp")
    assert (read.ctx_per_slot, read.slots, read.model_bytes) == (4096, 2, 98_000_000)
    assert read.quantisation == "Q4_1"
    assert read.build == "b7000-abc" and "n_vocab=49152" in read.architecture
    with pytest.raises(ValueError, match="not a JSON object"):
        ServerIdentity.from_json(["not", "a", "dict"])


# ---------------------------------------------------------------- prefix


@given(st.lists(st.integers(0, 5), max_size=40), st.lists(st.integers(0, 5), max_size=40))
def test_the_kept_tokens_are_always_a_prefix_of_both(cached, prompt):
    kept = common_prefix(cached, prompt)
    assert cached[:kept] == prompt[:kept]
    assert kept == min(len(cached), len(prompt)) or cached[kept] != prompt[kept]


@pytest.mark.parametrize("seed", range(5))
def test_a_whole_prefix_restores_and_a_cut_restores_only_a_long_shared_head(seed):
    rng = random.Random(seed)
    task = [rng.randrange(50_000) for _ in range(rng.randint(300, 900))]
    turns = [rng.randrange(50_000) for _ in range(rng.randint(2000, 6000))]
    cached = task + turns
    follow_up = decision = prefix_decision(cached, [*cached, 1, 2, 3], min_tokens=256)
    assert decision.restore and decision.whole and decision.kept == len(cached)
    after_cut = [*task, 7, 7, 7, *turns[-100:]]  # the window restarts from the task + NOTES
    decision = prefix_decision(cached, after_cut, min_tokens=256)
    assert decision.restore and not decision.whole and decision.kept == len(task)
    assert after_cut[: decision.kept] == cached[: decision.kept]
    too_short = prefix_decision(cached, after_cut, min_tokens=len(task) + 1)
    assert not too_short.restore
    unrelated = prefix_decision(cached, [t + 1 for t in cached], min_tokens=1)
    assert not unrelated.restore and unrelated.kept == 0
    assert follow_up.kept > 0


def test_an_empty_cache_is_never_restored():
    assert not prefix_decision([], [1, 2, 3], min_tokens=1).restore


# ---------------------------------------------------------------- the slot file's tokens


def slot_file(values: list[int], version: int = 4) -> bytes:
    return struct.pack(f"<III{len(values)}i", 0x67677371, version, len(values), *values) + b"kv"


@pytest.mark.parametrize("count", [0, 1, 7, 6500])
def test_the_cached_tokens_are_read_from_a_slot_files_header(count):
    tokens = list(range(1, count + 1))
    assert read_cached_tokens(slot_file(tokens, version=2)) == tokens  # older servers
    record = [-1, 1, count, *tokens, 0]  # llama-server's own token record
    assert read_cached_tokens(slot_file(record)) == tokens


@pytest.mark.parametrize(
    ("head", "why"),
    [
        (b"ggs", "too short"),
        (struct.pack("<III", 0x12345678, 2, 0), "magic"),
        (struct.pack("<III", 0x67677371, 9, 0), "version"),
        (struct.pack("<IIIi", 0x67677371, 2, 5, 1), "ends before"),
        (slot_file([-1, 2, 1, 5, 0]), "unknown version"),
        (slot_file([-1, 1, 1, 5, 1, 9]), "media"),
        (slot_file([-1, 1, 3, 5, 0]), "add up"),
    ],
)
def test_a_slot_file_of_another_layout_is_refused(head, why):
    with pytest.raises(ValueError, match=why):
        read_cached_tokens(head)


# ---------------------------------------------------------------- pruning


@pytest.mark.parametrize("seed", range(6))
def test_pruning_drops_the_least_recently_used_until_the_rest_fit(seed):
    rng = random.Random(seed)
    files = [
        ParkedFile(name=f"f{i}", size=rng.randint(1, 100), last_used=rng.random())
        for i in range(rng.randint(1, 30))
    ]
    budget = rng.randint(0, sum(f.size for f in files))
    dropped = prune_plan(files, budget)
    kept = [f for f in files if f.name not in dropped]
    assert sum(f.size for f in kept) <= budget
    if dropped and kept:  # only older files went
        assert max(f.last_used for f in files if f.name in dropped) <= min(
            f.last_used for f in kept
        )
    if dropped:  # and no more than needed: keeping the newest dropped one would not fit
        newest = max((f for f in files if f.name in dropped), key=lambda f: f.last_used)
        assert sum(f.size for f in kept) + newest.size > budget


def test_a_file_being_restored_is_never_pruned():
    files = [ParkedFile(name="old", size=10, last_used=0.0)]
    files.append(ParkedFile(name="new", size=10, last_used=1.0))
    assert prune_plan(files, 5, keep=frozenset({"old"})) == ["new"]
    assert prune_plan(files, 100) == []


# ---------------------------------------------------------------- counting what was spared


def test_prompt_counts_prefer_llama_servers_timings_then_usage():
    assert prompt_counts({"timings": {"prompt_n": 12, "cache_n": 6400}}) == (12, 6400)
    usage = {"prompt_tokens": 6412, "prompt_tokens_details": {"cached_tokens": 6400}}
    assert prompt_counts({"usage": usage}) == (12, 6400)
    assert prompt_counts({"usage": {"prompt_tokens": 30}}) == (30, 0)
    assert prompt_counts({"choices": []}) is None
