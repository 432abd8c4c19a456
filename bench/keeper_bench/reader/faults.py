"""The faults real models make, injected into the simulated reader on purpose.

The keeper's guards (re-asks, loop guards, the retry without thinking) exist because real models
misread, reply with nothing, think to their limit and search in circles. A benchmark that only ever
met a perfect reader could not show that the guards work, so each of those behaviours can be
switched on at a rate. The same mix applies to every call the reader answers, whatever the arm:
work calls, note calls, summary calls and rewrite calls alike (searches only where a call can
search), so what an arm loses to faults comes from how it copes with them.

Every decision is a hash of (seed, fault name, a digest of the request), never a running random
generator: the same request always gets the same reply, whatever was asked before, and a run is
reproduced by its seed alone.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from keeper_middleware.messages.facts import text_of

FaultName = Literal[
    "sign_flip",
    "other_amount",
    "overlooked",
    "wrong_actor",
    "stale_value",
    "invent_working",
    "empty_reply",
    "think_to_limit",
    "repeat_search",
    "circle_searches",
    "drop_rules",
]
MISREAD_KINDS: tuple[FaultName, ...] = (
    "sign_flip",
    "other_amount",
    "overlooked",
    "wrong_actor",
    "stale_value",
    "invent_working",
)
"""The ways a reader gets one statement wrong, each a fault of its own with its own rate. Each
strikes one statement among those a call reads (story text, search results, passages, a summary,
the NOTES or a pinned state), wherever the call's reply goes: an answer, notes, a summary."""

_REASONING_SENTENCE = (
    "Let me re-read the items once more and check every counter against the notes before "
    "answering, in case an earlier change was missed. "
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReaderFaults:
    """How often each fault fires: a rate in [0, 1], plus the seed that decides. A misread kind's
    rate is per statement read (each statement a call reads, on its own draw); every other
    fault's is per request (``drop_rules``: per rule written)."""

    sign_flip: float = 0.0
    """A change is read with the wrong sign: a set as its negative ("recorded X at 342" used and
    noted as -342), an amount added as taken and the other way round."""
    other_amount: float = 0.0
    """A change is read with another amount stated in the same text (another change's amount)."""
    overlooked: float = 0.0
    """A change (or a line of a memory) is not seen at all."""
    wrong_actor: float = 0.0
    """A change is credited to another actor named in the same text."""
    stale_value: float = 0.0
    """A counter's last change in the text is seen but not applied: the value it held before is
    written or used as its value now."""
    invent_working: float = 0.0
    """A value stated outright is written with working built from a plausible amount (another
    amount from the same text, else one from 1 to 99), and the value that working gives: the
    lab's "recorded at 523" noted as 650 - 27 = 623."""
    empty_reply: float = 0.0
    """The reply is empty (content "", finish_reason "stop")."""
    think_to_limit: float = 0.0
    """The reply spends its budget thinking and writes nothing (finish_reason "length").
    Never fires on a call that switches thinking off."""
    repeat_search: float = 0.0
    """After getting a search's results, the same search is sent again."""
    circle_searches: float = 0.0
    """While a question is open, searches cycle among three commands (ignoring refusals) until
    the stop line arrives."""
    drop_rules: float = 0.0
    """Each rule a reply would write into a memory (a RULE line of a notes reply or a rewrite,
    a rule sentence of a summary or a pinned state) is left out, each rule on its own."""
    seed: int = 0

    def __post_init__(self) -> None:
        for field in fields(self):
            if field.name == "seed":
                continue
            rate = getattr(self, field.name)
            if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate <= 1:
                raise ValueError(
                    f"ReaderFaults.{field.name} must be a rate between 0 and 1, got {rate!r}; "
                    "use 0 to switch the fault off and 1 to make it fire on every request."
                )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"ReaderFaults.seed must be an int, got {self.seed!r}.")

    def fires(self, fault: FaultName, digest: str) -> bool:
        """Whether ``fault`` fires for the request whose digest is ``digest``."""
        rate = float(getattr(self, fault))
        if rate <= 0.0:
            return False
        if rate >= 1.0:
            return True
        return unit_hash(self.seed, fault, digest) < rate

    def fires_for(self, fault: FaultName, digest: str, what: str) -> bool:
        """Whether ``fault`` strikes ``what`` (one rule, say) in the request ``digest``: each
        thing decided on its own, at the fault's rate."""
        rate = float(getattr(self, fault))
        if rate <= 0.0:
            return False
        if rate >= 1.0:
            return True
        return unit_hash(self.seed, f"{fault}/{what}", digest) < rate

    def pick(self, fault: FaultName, digest: str, count: int) -> int:
        """A deterministic index in ``range(count)`` for where a fault strikes."""
        if count <= 0:
            raise ValueError(f"pick needs at least one candidate, got count={count}.")
        return int(unit_hash(self.seed, f"{fault}/where", digest) * count) % count


NO_FAULTS = ReaderFaults()
REALISTIC_FAULTS = ReaderFaults(
    sign_flip=0.02,
    other_amount=0.02,
    overlooked=0.02,
    wrong_actor=0.02,
    stale_value=0.02,
    invent_working=0.02,
    empty_reply=0.02,
    think_to_limit=0.02,
    repeat_search=0.05,
    circle_searches=0.02,
    drop_rules=0.02,
)
"""A stated mix, not a measurement: each fault on a few requests in a hundred (each misread kind
on 2 in 100 of the statements read; each rule left out of 2 in 100 memory writes),
for every call of every arm (work, notes, re-asks, summaries, rewrites, memory edits).
``--faults realistic`` on the command line; the sensitivity table shows each alone."""
FAULT_PRESETS = {"none": NO_FAULTS, "realistic": REALISTIC_FAULTS}


def fault_preset(name: str, *, seed: int = 0) -> ReaderFaults:
    """A named fault mix ("none" or "realistic") with its seed."""
    if name not in FAULT_PRESETS:
        raise ValueError(f"unknown fault mix {name!r}; choose one of {', '.join(FAULT_PRESETS)}")
    return replace(FAULT_PRESETS[name], seed=seed)


def unit_hash(seed: int, label: str, digest: str) -> float:
    """A number in [0, 1) fixed by its inputs."""
    raw = hashlib.sha256(f"{seed}|{label}|{digest}".encode()).digest()
    return int.from_bytes(raw[:8], "big") / 2**64


def request_digest(
    messages: Sequence[BaseMessage], *, extra: Mapping[str, Any] | None = None
) -> str:
    """A digest of exactly what was sent: roles, texts, tool calls and tool-call ids."""
    parts: list[Any] = []
    for message in messages:
        entry: dict[str, Any] = {"type": message.type, "text": text_of(message)}
        if isinstance(message, AIMessage) and message.tool_calls:
            entry["calls"] = [[call["name"], call["args"]] for call in message.tool_calls]
        if isinstance(message, ToolMessage):
            entry["call_id"] = message.tool_call_id
        parts.append(entry)
    payload = json.dumps([parts, dict(extra or {})], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()


def thinking_switched_off(kwargs: Mapping[str, Any]) -> bool:
    """True when the call turns thinking off (``reasoning_effort="none"`` or the chat template)."""
    if kwargs.get("reasoning_effort") == "none":
        return True
    extra_body = kwargs.get("extra_body")
    if isinstance(extra_body, Mapping):
        template = extra_body.get("chat_template_kwargs")
        if isinstance(template, Mapping) and template.get("enable_thinking") is False:
            return True
    return False


def runaway_reasoning(digest: str, *, sentences: int = 400) -> str:
    """The reasoning text of a reply that thought to its limit: long, and fixed by the request."""
    return f"[{digest[:8]}] " + _REASONING_SENTENCE * sentences
