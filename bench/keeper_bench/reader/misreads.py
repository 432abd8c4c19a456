"""Misreads: one statement read wrong, the same way whatever the reply is for.

A real model misreads what it is sent, not what a benchmark can check: a sign, an amount taken
from the next sentence, a change it skims past, the wrong person, an old value it carries on, or
working it makes up. Each kind is a fault of its own (``ReaderFaults``), and each strikes the
statements a call reads, before the reader works anything out from them: the story batches, the
lines of search results and passages, a summary's lines and the values a memory holds (the NOTES,
a pinned state). So a misread in an answer, a notes reply, a summary or a memory edit is the same
event, and what an arm loses to it comes from what its method does next (a check, a re-ask, a
summary that carries it forward).

Each kind strikes each statement read on its own, at the kind's rate (a draw per statement per
call): at 2% a call that reads 300 statements misreads about six of them, so the rate means the
share of statements read wrong, whatever an arm's calls read. Statements are grouped by the text
they come from (one batch, one item's passage lines, one summary line, the memory's values):
"another amount" and "another actor" are taken from the same text. Pure: statements in,
statements out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from keeper_bench.reader.faults import MISREAD_KINDS, FaultName, ReaderFaults, unit_hash
from keeper_bench.reader.text import Event

_FLIPPED = {"add": "take", "take": "add", "add_held": "take_held", "take_held": "add_held"}
_ON_MEMORY = frozenset({"sign_flip", "other_amount", "overlooked"})
"""The kinds that can strike a memory's value line (it states a value: no actor, no change)."""


@dataclass(frozen=True, slots=True)
class Misreads:
    """The misreads that strike one call.

    ``faults`` and ``digest`` (a request's rates and digest): each statement read is struck by
    each kind on its own draw. ``draws`` (kind, where, which in [0, 1)): one misread of a kind
    placed by hand, at that share of its candidates, for a test that wants one known strike.
    """

    draws: tuple[tuple[str, float, float], ...] = ()
    faults: ReaderFaults | None = None
    digest: str = ""

    def __bool__(self) -> bool:
        return bool(self.draws) or bool(self.rated_kinds)

    @property
    def rated_kinds(self) -> tuple[FaultName, ...]:
        """The kinds that strike statement by statement (a rate above zero)."""
        if self.faults is None:
            return ()
        return tuple(kind for kind in MISREAD_KINDS if float(getattr(self.faults, kind)) > 0)

    def strikes(self, kind: FaultName, statement: str) -> float | None:
        """Whether ``kind`` strikes the statement keyed ``statement`` in this call: its "which"
        draw when it does, None when it does not."""
        faults = self.faults
        if faults is None:
            return None
        key = f"{self.digest}/{statement}"
        if not faults.fires_for(kind, key, "statement"):
            return None
        return unit_hash(faults.seed, f"{kind}/which", key)


NO_MISREADS = Misreads()


def misreads_for(faults: ReaderFaults, digest: str) -> Misreads:
    """The misreads the request ``digest`` gets: every kind strikes each statement read on its
    own, at its own rate."""
    found = Misreads(faults=faults, digest=digest)
    return found if found else NO_MISREADS


def _pick(draw: float, count: int) -> int:
    return min(count - 1, int(draw * count))


def misread(
    groups: Sequence[Sequence[Event]],
    misreads: Misreads,
    *,
    memory: frozenset[int] = frozenset(),
) -> list[list[Event]]:
    """The statements as read: each kind strikes each of its candidates on its own draw (and
    each hand-placed draw strikes one candidate).

    ``groups`` are the statements of each text in reading order; the groups whose indices are in
    ``memory`` are a memory's value lines (read as sets with no actor): only a sign, another
    amount or an overlooked line can strike those. A kind with no candidate in what was read
    changes nothing.
    """
    result = [list(group) for group in groups]
    overlooked: set[tuple[int, int]] = set()
    for rated in misreads.rated_kinds:
        for group, position in _candidates(result, rated, memory):
            drawn = misreads.strikes(rated, f"{group}/{position}")
            if drawn is None:
                continue
            if rated == "overlooked":
                overlooked.add((group, position))
            else:
                event = result[group][position]
                result[group][position] = _misread(rated, event, result[group], drawn)
    for group, position in sorted(overlooked, reverse=True):
        del result[group][position]
    for kind, where, which in misreads.draws:
        candidates = _candidates(result, kind, memory)
        if not candidates:
            continue
        group, position = candidates[_pick(where, len(candidates))]
        event = result[group][position]
        if kind == "overlooked":
            del result[group][position]
            continue
        result[group][position] = _misread(kind, event, result[group], which)
    return result


def _other_amounts(group: Sequence[Event], event: Event) -> list[int]:
    """The other amounts the same text states (in a fixed order)."""
    found = {o.amount for o in group if o is not event and o.amount is not None}
    return sorted(found - {event.amount}, key=str)  # type: ignore[arg-type]


def _other_actors(group: Sequence[Event], event: Event) -> list[str]:
    """The other actors the same text names (in a fixed order)."""
    return sorted({o.actor for o in group if o is not event and o.actor} - {event.actor})


def _candidates(
    groups: Sequence[Sequence[Event]], kind: str, memory: frozenset[int]
) -> list[tuple[int, int]]:
    found: list[tuple[int, int]] = []
    last_of: dict[str, tuple[int, int]] = {}
    for g, group in enumerate(groups):
        in_memory = g in memory
        if in_memory and kind not in _ON_MEMORY:
            continue
        for p, event in enumerate(group):
            if not event.applied:
                continue
            if kind == "sign_flip":
                ok = event.amount not in (None, 0) or event.kind in _FLIPPED
            elif kind == "other_amount":
                ok = event.amount is not None and bool(_other_amounts(group, event))
            elif kind == "overlooked":
                ok = True
            elif kind == "wrong_actor":
                ok = bool(event.actor) and bool(_other_actors(group, event))
            elif kind == "invent_working":
                ok = event.kind == "set" and event.amount is not None and event.working is None
            else:  # stale_value: the last change to each counter
                ok = bool(event.actor)
                if ok:
                    last_of[event.name] = (g, p)
                continue
            if ok:
                found.append((g, p))
    if kind == "stale_value":
        found = sorted(last_of.values())
    return found


def _misread(kind: str, event: Event, group: Sequence[Event], which: float) -> Event:
    if kind == "sign_flip":
        if event.kind == "set":
            assert event.amount is not None
            return replace(event, amount=-event.amount)
        return replace(event, kind=_FLIPPED[event.kind])  # type: ignore[arg-type]
    if kind == "other_amount":
        # (an earlier strike in the same text can have left no other amount or actor)
        amounts = _other_amounts(group, event)
        return replace(event, amount=amounts[_pick(which, len(amounts))]) if amounts else event
    if kind == "wrong_actor":
        actors = _other_actors(group, event)
        return replace(event, actor=actors[_pick(which, len(actors))]) if actors else event
    if kind == "stale_value":
        return replace(event, applied=False)
    # invent_working: the stated value plus or minus a plausible amount, with that working
    assert event.amount is not None
    amounts = [a for a in _other_amounts(group, event) if a > 0]
    step = amounts[_pick(which, len(amounts))] if amounts else 1 + int(which * 99)
    sign = "+" if int(which * 1000) % 2 == 0 else "-"
    value = event.amount + step if sign == "+" else event.amount - step
    return replace(event, amount=value, working=f"{event.amount} {sign} {step}")


def misread_memory_and_text(
    values: Mapping[str, int | None],
    groups: Sequence[Sequence[Event]],
    misreads: Misreads,
) -> tuple[dict[str, int | None], list[list[Event]]]:
    """A memory's values (NOTES STATE, a pinned state) and the texts read after them, with the
    call's misreads applied to both: what a notes reply or a memory edit starts from."""
    if not misreads:
        return dict(values), [list(group) for group in groups]
    memory = [Event("set", k, v, None, "") for k, v in values.items() if v is not None]
    read = misread([memory, *groups], misreads, memory=frozenset({0}))
    kept = {event.name: event.amount for event in read[0]}
    new_values = {k: kept.get(k) for k in values if k in kept or values[k] is None}
    return new_values, read[1:]
