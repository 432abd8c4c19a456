"""Mapping an agent's whole, ever-growing history onto the keeper's state (pure functions).

The agent sends everything on every call; the proxy keeps its own window (what the upstream
sees: the task, the NOTES, the turns still in view, its own archive searches) and remembers one
fingerprint per agent message it has taken in. The rule for each request:

- **New messages** are the suffix after the longest known prefix: the agent's messages are
  compared, position by position, with the fingerprints taken in so far.
- **An edit, a truncation or a resend** makes the known prefix shorter than what was taken in.
  The messages from that point on are *withdrawn*. Those still in the live window after the
  NOTES are removed from it, together with whatever the proxy placed after them (repeated rules,
  its searches); the NOTES' count of kept messages is lowered to match, and the agent's version
  of everything after the known prefix is taken in as new. Withdrawn messages that were archived,
  or that sit in the pinned head once NOTES exist, stay where they are: the archive is never
  edited, and what the NOTES recorded from them stays recorded. When the agent changed messages
  in place (same positions) and all of them are out of view like that, only the agent's new
  version of the changed ones is taken in, as new input at the end of the window; the unchanged
  messages after them stay as they are.
- **A retry** of a request that failed sends nothing new: the messages it brought were taken in
  before the upstream was called, so they are neither lost nor taken in twice.
- **The reply** the proxy returns is taken in with the fingerprint of the form the agent
  receives, so the agent sending it back is recognised as known. An agent that drops or changes
  it withdraws it, which also covers "regenerate".

Sessions are named by the ``X-Keeper-Session`` header, or else by a hash of the conversation's
opening (system prompt and first user message), so an agent that sends no header still gets one
session per conversation.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage, messages_from_dict, messages_to_dict

from keeper_middleware.counters import Counters
from keeper_middleware.messages import keeper_kind, text_of
from keeper_middleware.notes import parse_notes, render_notes

__all__ = [
    "RECORD_KEY",
    "SESSION_HEADER",
    "Intake",
    "ProxyStats",
    "SessionIdError",
    "SessionRecord",
    "StoredRecord",
    "fallback_session",
    "known_prefix",
    "render_metrics",
    "resolve_session",
    "take_in",
    "withdraw",
]

SESSION_HEADER = "x-keeper-session"
_SESSION_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
RECORD_KEY = "proxy_session"
_RECORD_VERSION = 1
TAKEN_CHUNK = 512
"""Fingerprints per stored chunk: a save rewrites only the chunks that changed."""


class SessionIdError(ValueError):
    """A session id that cannot be used (it names files and rows, so its alphabet is small)."""


def resolve_session(
    header: str | None, system_prompt: str | None, messages: Sequence[BaseMessage]
) -> str:
    """The session a request belongs to: the header when given, else the fallback hash."""
    if header is None:
        return fallback_session(system_prompt, messages)
    if not _SESSION_ID.fullmatch(header):
        raise SessionIdError(
            f"X-Keeper-Session {header[:40]!r} is not a valid session id: use 1 to 128 of the "
            "characters A-Z a-z 0-9 . _ -"
        )
    return header


def fallback_session(system_prompt: str | None, messages: Sequence[BaseMessage]) -> str:
    """``auto-<hash>`` of the system prompt and the first user message (or the first message)."""
    first = next((m for m in messages if isinstance(m, HumanMessage)), messages[0])
    opening = [system_prompt or "", first.content]
    text = json.dumps(opening, sort_keys=True, ensure_ascii=False, default=str)
    return "auto-" + hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """What the proxy keeps per session besides the keeper's archive and notes."""

    window: tuple[BaseMessage, ...] = ()
    """The live window: exactly what the upstream is sent after the system prompt."""
    keeper_state: Mapping[str, Any] = field(default_factory=dict)
    """The keeper's JSON-like bookkeeping (``StepResult.state``)."""
    taken: tuple[tuple[str, str], ...] = ()
    """(fingerprint, message id) of every agent message taken in, in the agent's order."""

    def to_json(self) -> dict[str, Any]:
        return {
            "version": _RECORD_VERSION,
            "window": messages_to_dict(list(self.window)),
            "keeper_state": dict(self.keeper_state),
            "taken": [list(pair) for pair in self.taken],
        }

    @classmethod
    def from_json(cls, data: object) -> SessionRecord:
        if not isinstance(data, dict):
            return cls()
        return cls(
            window=tuple(messages_from_dict(data.get("window") or [])),
            keeper_state=dict(data.get("keeper_state") or {}),
            taken=tuple((str(d), str(i)) for d, i in data.get("taken") or []),
        )

    def appended(self, messages: Sequence[BaseMessage]) -> SessionRecord:
        return replace(self, window=(*self.window, *messages))


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """A session record as the archive holds it: the window and state in one value under
    ``RECORD_KEY``, the fingerprints in chunks of ``TAKEN_CHUNK`` under their own keys.

    The fingerprints grow with the whole conversation while the window does not, so a save
    writes the head and only the chunks that changed (usually the last). Changed chunks get new
    keys (a new ``generation``) and the head, written last, names the chunks it uses: a save cut
    short leaves the previous head and its chunks intact.
    """

    record: SessionRecord
    chunk_keys: tuple[str, ...] = ()
    generation: int = 0

    @classmethod
    def load(cls, head: object, read: Callable[[str], object]) -> StoredRecord:
        """From the head value and a reader of other keys; a head that holds its fingerprints
        inline (the first format) is read as it is."""
        record = SessionRecord.from_json(head)
        if not isinstance(head, dict) or not isinstance(head.get("taken_chunks"), list):
            return cls(record)
        keys = tuple(str(k) for k in head["taken_chunks"])
        taken: list[tuple[str, str]] = []
        for key in keys:
            chunk = read(key)
            if not isinstance(chunk, list):
                raise ValueError(
                    f"the archive has no {key!r}, a part of this session's record; restore the "
                    "archive file from a backup, or delete the session to start it again"
                )
            taken += [(str(d), str(i)) for d, i in chunk]
        count = int(head.get("taken_count", len(taken)))
        return cls(replace(record, taken=tuple(taken[:count])), keys, int(head["generation"]))

    def saved(self, record: SessionRecord) -> tuple[StoredRecord, dict[str, Any], list[str]]:
        """(the stored form of ``record``, the values to write in order with the head last, the
        keys no longer used, to clear after the head is written)."""
        generation = self.generation + 1
        writes: dict[str, Any] = {}
        keys: list[str] = []
        for number, start in enumerate(range(0, len(record.taken), TAKEN_CHUNK)):
            part = record.taken[start : start + TAKEN_CHUNK]
            unchanged = number < len(self.chunk_keys) and (
                self.record.taken[start : start + TAKEN_CHUNK] == part
            )
            if unchanged:
                keys.append(self.chunk_keys[number])
                continue
            key = f"{RECORD_KEY}.taken.{number}.{generation}"
            writes[key] = [list(pair) for pair in part]
            keys.append(key)
        head = {
            **replace(record, taken=()).to_json(),
            "taken_chunks": keys,
            "taken_count": len(record.taken),
            "generation": generation,
        }
        writes[RECORD_KEY] = head
        stale = [k for k in self.chunk_keys if k not in keys]
        return StoredRecord(record, tuple(keys), generation), writes, stale


@dataclass(frozen=True, slots=True)
class Intake:
    """What taking in one request changed."""

    record: SessionRecord
    new: int
    """Agent messages taken in as new."""
    withdrawn: int
    """Earlier agent messages the request no longer carries (edited, dropped or resent)."""
    removed_from_view: int
    """Window messages removed with them (theirs and what the proxy had placed after them)."""


def known_prefix(taken: Sequence[str], digests: Sequence[str]) -> int:
    """How many leading messages of the request are the ones taken in, in order."""
    length = 0
    for mine, theirs in zip(taken, digests, strict=False):
        if mine != theirs:
            break
        length += 1
    return length


def take_in(
    record: SessionRecord,
    messages: Sequence[BaseMessage],
    digests: Sequence[str],
    new_id: Callable[[], str],
) -> Intake:
    """The record after the agent's request: withdrawals applied, new messages appended."""
    known = [d for d, _ in record.taken]
    prefix = known_prefix(known, digests)
    edited = _edited_out_of_view(record, digests, prefix)
    if edited is not None:
        withdrawn_ids = {record.taken[i][1] for i in edited}
        window = withdraw(record.window, withdrawn_ids)
        taken, incoming = list(record.taken), [*edited, *range(len(known), len(digests))]
    else:
        prefix, window = _truncate(record, prefix)
        withdrawn_ids = {msg_id for _, msg_id in record.taken[prefix:]}
        taken, incoming = list(record.taken[:prefix]), list(range(prefix, len(digests)))
    fresh: list[BaseMessage] = []
    for i in incoming:
        message = messages[i].model_copy(update={"id": new_id()})
        fresh.append(message)
        if i < len(taken):
            taken[i] = (digests[i], str(message.id))
        else:
            taken.append((digests[i], str(message.id)))
    return Intake(
        record=replace(record, window=(*window, *fresh), taken=tuple(taken)),
        new=len(fresh),
        withdrawn=len(withdrawn_ids),
        removed_from_view=len(record.window) - len(window),
    )


def _truncate(record: SessionRecord, prefix: int) -> tuple[int, tuple[BaseMessage, ...]]:
    """Withdraw everything from ``prefix`` on; if that takes an earlier-taken message out of the
    window too (one taken in after an out-of-view edit sits late in the window), withdraw from
    there, so every message counted as taken in is in view or in the archive."""
    while True:
        window = withdraw(record.window, {msg_id for _, msg_id in record.taken[prefix:]})
        lost = {str(m.id) for m in record.window} - {str(m.id) for m in window}
        earlier = [i for i in range(prefix) if record.taken[i][1] in lost]
        if not earlier:
            return prefix, window
        prefix = min(earlier)


def _edited_out_of_view(
    record: SessionRecord, digests: Sequence[str], prefix: int
) -> list[int] | None:
    """Positions edited in place, when every one of them is out of view (else None)."""
    known = [d for d, _ in record.taken]
    if not prefix < len(known) <= len(digests):
        return None
    edited = [i for i in range(prefix, len(known)) if known[i] != digests[i]]
    in_view = _removable_ids(record.window)
    if any(record.taken[i][1] in in_view for i in edited):
        return None
    return edited


def _removable_ids(window: Sequence[BaseMessage]) -> set[str]:
    """Ids of the messages that can still leave the window: those after the NOTES."""
    notes_at = next((i for i, m in enumerate(window) if keeper_kind(m) == "notes"), None)
    floor = 0 if notes_at is None else notes_at + 1
    return {str(m.id) for m in window[floor:]}


def withdraw(window: Sequence[BaseMessage], ids: set[str]) -> tuple[BaseMessage, ...]:
    """The window without the withdrawn messages that can still leave it, and what follows them.

    Only messages after the NOTES can leave (the pinned head stays once NOTES exist). When the
    first one removed is among the messages the NOTES say were kept in view, the NOTES' kept count
    is lowered so the keeper does not take later messages for already noted.
    """
    notes_at = next((i for i, m in enumerate(window) if keeper_kind(m) == "notes"), None)
    floor = 0 if notes_at is None else notes_at + 1
    cut = next((i for i in range(floor, len(window)) if str(window[i].id) in ids), None)
    if cut is None:
        return tuple(window)
    kept = list(window[:cut])
    if notes_at is not None:
        notes, kept_count = parse_notes(text_of(window[notes_at]))
        still_kept = min(kept_count, cut - floor)
        if still_kept != kept_count:
            text = render_notes(notes, kept=still_kept)
            kept[notes_at] = window[notes_at].model_copy(update={"content": text})
    return tuple(kept)


# -------------------------------------------------------------------- counters and /metrics


@dataclass(slots=True)
class ProxyStats:
    """What the proxy adds to the keeper's counters, per session (persisted as JSON)."""

    requests: int = 0
    upstream_calls: int = 0
    """Every upstream chat call: work, notes, re-asks."""
    upstream_retries: int = 0
    upstream_failures: int = 0
    """Requests answered with an upstream error after the retries ran out."""
    search_rounds: int = 0
    """Upstream replies whose archive searches the proxy answered and called again for."""
    loop_limit_hits: int = 0
    withdrawn_messages: int = 0
    upstream_seconds: float = 0.0
    added_seconds: float = 0.0
    """Time the proxy added: request time minus time spent waiting for the upstream."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

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


_KEEPER_METRICS = (
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
    ("notes_tokens", "gauge", "Tokens of the NOTES as last written."),
    ("archive_turns", "gauge", "Turns in the archive."),
    ("peak_window", "gauge", "Largest request sent, in tokens."),
)
_PROXY_METRICS = (
    ("requests", "counter", "Chat requests answered or failed."),
    ("upstream_calls", "counter", "Upstream chat calls."),
    ("upstream_retries", "counter", "Upstream calls retried."),
    ("upstream_failures", "counter", "Requests that failed on the upstream."),
    ("search_rounds", "counter", "Replies whose searches the proxy answered."),
    ("loop_limit_hits", "counter", "Requests that hit the upstream call limit."),
    ("withdrawn_messages", "counter", "Agent messages withdrawn by edits or resends."),
    ("upstream_seconds", "counter", "Seconds spent waiting for the upstream."),
    ("added_seconds", "counter", "Seconds the proxy added beyond the upstream's time."),
)


def render_metrics(sessions: Mapping[str, tuple[Counters, ProxyStats]]) -> str:
    """Prometheus text format: every figure per session (label ``session``) and in total."""
    lines: list[str] = []
    rows = {s: {**c.to_json(), **p.to_json()} for s, (c, p) in sorted(sessions.items())}
    for name, kind, help_text in (*_KEEPER_METRICS, *_PROXY_METRICS):
        metric = f"keeper_proxy_{name}" + ("_total" if kind == "counter" else "")
        lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} {kind}"]
        lines.append(f"{metric} {_number(sum(row[name] for row in rows.values()))}")
        lines += [f'{metric}{{session="{s}"}} {_number(row[name])}' for s, row in rows.items()]
    prompt = sum(row["prompt_tokens"] for row in rows.values())
    cached = sum(row["cached_tokens"] for row in rows.values())
    lines += [
        "# HELP keeper_proxy_cached_ratio Share of prompt tokens served from the prefix cache.",
        "# TYPE keeper_proxy_cached_ratio gauge",
        f"keeper_proxy_cached_ratio {_number(cached / prompt if prompt else 0.0)}",
    ]
    for s, row in rows.items():
        ratio = row["cached_tokens"] / row["prompt_tokens"] if row["prompt_tokens"] else 0.0
        lines.append(f'keeper_proxy_cached_ratio{{session="{s}"}} {_number(ratio)}')
    return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6f}"
