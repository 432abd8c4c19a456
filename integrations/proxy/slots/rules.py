"""The pure rules of slot parking: file names, when a parked cache may come back, what to prune.

A llama.cpp server has a few slots, each holding one conversation's KV cache. With more sessions
than slots, a switch evicts a cache and the next request of that session re-reads its whole
window. Parking saves the evicted cache to disk (``POST /slots/{id}?action=save``) and restores it
(``action=restore``) before that session's next request. The I/O lives in :mod:`.parking`; what it
decides lives here, so each rule can be tested on its own:

- **Names.** A parked file is named by a hash of the tenant and the stored session name, never by
  anything the caller typed, so no session id can reach outside the slot folder or collide with
  another tenant's.
- **Identity.** A KV cache is only valid on the model, quantisation, context and build that wrote
  it. What the server reported when the file was saved (``/props``, ``/v1/models``, the model
  file's fingerprint) is kept beside it and compared before a restore; any difference refuses the
  file (the session is re-read instead: slower, never a wrong answer).
- **Prefix.** A restored cache holds tokens ``T``; the next request reads tokens ``P``. The server
  keeps the longest common prefix ``T[:k]`` of the two, drops the rest of the cache and reads
  ``P[k:]``. So the part of a restored cache that is *used* is always a prefix of the request;
  after a cut (the window restarts from the task and the NOTES) ``k`` is the shared head, and a
  restore still spares those ``k`` tokens. A restore is only made when ``k`` is worth it
  (:func:`prefix_decision`); below that the cache is refused and erased.
- **Budget.** Parked files are pruned least recently used first until they fit the disk budget.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

from keeper_middleware.errors import MalformedDataError

__all__ = [
    "REFUSAL_REASONS",
    "ParkedFile",
    "PrefixDecision",
    "ServerIdentity",
    "common_prefix",
    "parked_name",
    "prefix_decision",
    "prompt_counts",
    "prune_plan",
    "read_cached_tokens",
    "refusal_reason",
]

RefusalReason = Literal[
    "build", "model", "quantisation", "context", "slots", "prefix", "missing", "restore_failed"
]
REFUSAL_REASONS: tuple[RefusalReason, ...] = (
    "build",
    "model",
    "quantisation",
    "context",
    "slots",
    "prefix",
    "missing",
    "restore_failed",
)
"""Why a parked cache was not restored: the server build, the model, its quantisation, the
context per slot or the slot count differ from when it was saved; its tokens share too short a
prefix with the request; the file is gone or unreadable; the server refused it."""

_STATE_SEQ_MAGIC = 0x67677371  # 'ggsq': llama.cpp's sequence-state file
_STATE_SEQ_VERSIONS = (2, 3, 4)
_SERVER_TOKENS_VERSION = 1


def parked_name(stored_session: str) -> str:
    """The file name a session's cache is parked under: hashes only, so it is safe on any file
    system and says nothing about the session. The stored name already carries the tenant
    (``tenant:session``); the tenant's own hash leads, so one tenant's files sort together."""
    tenant = stored_session.split(":", 1)[0] if ":" in stored_session else ""
    tenant_hash = hashlib.sha256(tenant.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    session_hash = hashlib.sha256(stored_session.encode("utf-8", "surrogatepass")).hexdigest()
    return f"kv-{tenant_hash}-{session_hash[:40]}.bin"


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerIdentity:
    """What makes a KV cache valid: the server's build, the model and its quantisation, the
    context per slot and the slot count. Kept beside every parked file."""

    build: str = ""
    """``/props`` ``build_info``: another build may lay the cache out differently."""
    model_path: str = ""
    """``/props`` ``model_path`` (compared only when no fingerprint is known)."""
    model_fingerprint: str = ""
    """Size and hashes of the model file's head and tail, when the proxy can read it."""
    architecture: str = ""
    """``/v1/models`` ``meta``: vocabulary, parameters and embedding width, as one string."""
    quantisation: str = ""
    """``/v1/models`` ``meta.ftype``, e.g. ``Q4_1``."""
    model_bytes: int = 0
    """``/v1/models`` ``meta.size``: a different quantisation of the same model differs here."""
    ctx_per_slot: int = 0
    slots: int = 0

    def to_json(self) -> dict[str, Any]:
        return {spec.name: getattr(self, spec.name) for spec in fields(self)}

    @classmethod
    def from_json(cls, data: object) -> ServerIdentity:
        if not isinstance(data, Mapping):
            raise MalformedDataError("the identity is not a JSON object")
        values: dict[str, Any] = {}
        for spec in fields(cls):
            if spec.name in data:
                value = data[spec.name]
                values[spec.name] = int(value) if spec.type == "int" else str(value)
        return cls(**values)

    @classmethod
    def from_server(
        cls, props: Mapping[str, Any], models: Mapping[str, Any], fingerprint: str = ""
    ) -> ServerIdentity:
        """Read from llama-server's ``GET /props`` and ``GET /v1/models`` replies."""
        settings = props.get("default_generation_settings")
        ctx = settings.get("n_ctx") if isinstance(settings, Mapping) else None
        meta: Mapping[str, Any] = {}
        entries = models.get("data")
        if isinstance(entries, list) and entries and isinstance(entries[0], Mapping):
            found = entries[0].get("meta")
            meta = found if isinstance(found, Mapping) else {}
        shape = ",".join(
            f"{key}={meta.get(key)}" for key in ("vocab_type", "n_vocab", "n_params", "n_embd")
        )
        return cls(
            build=str(props.get("build_info", "")),
            model_path=str(props.get("model_path", "")),
            model_fingerprint=fingerprint,
            architecture=shape,
            quantisation=str(meta.get("ftype") or ""),
            model_bytes=int(meta.get("size") or 0),
            ctx_per_slot=int(ctx or 0),
            slots=int(props.get("total_slots") or 0),
        )


def refusal_reason(saved: ServerIdentity, now: ServerIdentity) -> RefusalReason | None:
    """Why a cache saved under ``saved`` must not be restored on ``now``; ``None``: it may."""
    if saved.build != now.build:
        return "build"
    if saved.architecture != now.architecture:
        return "model"
    if saved.quantisation != now.quantisation or saved.model_bytes != now.model_bytes:
        return "quantisation"
    if saved.model_fingerprint and now.model_fingerprint:
        if saved.model_fingerprint != now.model_fingerprint:
            return "model"
    elif saved.model_path != now.model_path:
        return "model"
    if saved.ctx_per_slot != now.ctx_per_slot:
        return "context"
    if saved.slots != now.slots:
        return "slots"
    return None


def common_prefix(cached: Sequence[int], prompt: Sequence[int]) -> int:
    """How many leading tokens the two share."""
    shared = 0
    for a, b in zip(cached, prompt, strict=False):
        if a != b:
            break
        shared += 1
    return shared


@dataclass(frozen=True, slots=True)
class PrefixDecision:
    """Whether to restore, and how many tokens of the cache the server will keep."""

    restore: bool
    kept: int
    """Tokens of the cache that are a prefix of the request (the server keeps these)."""
    whole: bool
    """The whole cache is a prefix of the request (nothing is dropped)."""


def prefix_decision(
    cached: Sequence[int], prompt: Sequence[int], *, min_tokens: int
) -> PrefixDecision:
    """Restore when the cache's common prefix with the request is at least ``min_tokens`` long
    (a whole-prefix cache always qualifies when it is that long). A shorter shared head is not
    worth the disk read: the server reads those few tokens faster than it loads a file."""
    kept = common_prefix(cached, prompt)
    whole = kept == len(cached) and kept > 0
    return PrefixDecision(restore=kept >= max(1, min_tokens), kept=kept, whole=whole)


def read_cached_tokens(head: bytes) -> list[int]:
    """The token ids a llama.cpp slot file holds, from its first bytes.

    The file starts with the ``'ggsq'`` magic, a layout version, a count and that many int32
    values. Older servers store the prompt's token ids there; llama-server now stores its own
    record in them: a null token (-1), the record's version (1), the number of ids, the ids,
    then the number of media chunks (0 for text). Any other layout raises ``ValueError``, so a
    file the proxy cannot read is refused, never guessed at."""
    if len(head) < 12:
        raise MalformedDataError("the slot file is too short to hold a header")
    magic, version, count = struct.unpack_from("<III", head, 0)
    if magic != _STATE_SEQ_MAGIC:
        raise MalformedDataError(f"the slot file's magic is {magic:#x}, not llama.cpp's 'ggsq'")
    if version not in _STATE_SEQ_VERSIONS:
        raise MalformedDataError(
            f"the slot file has layout version {version}, not {_STATE_SEQ_VERSIONS}"
        )
    if len(head) < 12 + 4 * count:
        raise MalformedDataError(f"the slot file ends before its {count} token ids")
    values = list(struct.unpack_from(f"<{count}i", head, 12))
    if not values or values[0] != -1:
        return values  # a plain list of token ids
    if len(values) < 4 or values[1] != _SERVER_TOKENS_VERSION:
        raise MalformedDataError("the slot file's token record has an unknown version")
    length = values[2]
    if length < 0 or len(values) != length + 4 or values[3 + length] != 0:
        raise MalformedDataError("the slot file's token record holds media or does not add up")
    return values[3 : 3 + length]


@dataclass(frozen=True, slots=True, kw_only=True)
class ParkedFile:
    """One parked cache as the pruning sees it."""

    name: str
    size: int
    last_used: float


def prune_plan(
    parked: Iterable[ParkedFile], budget: int, *, keep: frozenset[str] = frozenset()
) -> list[str]:
    """The files to delete, least recently used first, until the rest fit in ``budget`` bytes.
    Files in ``keep`` (being restored right now) are never chosen; if they alone exceed the
    budget, everything else goes and they stay until they are no longer needed."""
    files = sorted(parked, key=lambda f: (f.last_used, f.name))
    total = sum(f.size for f in files)
    chosen: list[str] = []
    for entry in files:
        if total <= budget:
            break
        if entry.name in keep:
            continue
        chosen.append(entry.name)
        total -= entry.size
    return chosen


def prompt_counts(data: Mapping[str, Any]) -> tuple[int, int] | None:
    """``(read, reused)`` prompt tokens of one reply: llama-server's ``timings.prompt_n`` and
    ``cache_n``, else the OpenAI usage (``prompt_tokens`` less ``cached_tokens``)."""
    timings = data.get("timings")
    if isinstance(timings, Mapping):
        read, reused = timings.get("prompt_n"), timings.get("cache_n")
        if isinstance(read, int) and isinstance(reused, int):
            return read, reused
    usage = data.get("usage")
    if not isinstance(usage, Mapping) or not isinstance(usage.get("prompt_tokens"), int):
        return None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    reused = cached if isinstance(cached, int) else 0
    return int(usage["prompt_tokens"]) - reused, reused
