"""Choosing the questions: a known distance back, spread over distance buckets, with true answers.

Every question records the item its fact comes from (``item``) and ``distance`` = the question's
``after_item`` − ``item``: for a current value or a tally it is the counter's last change, for an
old value or "who" the item asked about, and for a confidential counter (answer "protected") it
is item 1, where the rule was stated, since the value does not matter there. Four kinds ask for
more than one value: the value before a counter's last change (``item``: that last change), how
many times a counter changed in a span of items and which of three counters changed most often
in one (a gist: no exact value needed; ``item``: the span's first item), and which of two
counters was recorded first (``item``: the earlier first record). A question about a
name the stream never uses has no fact: ``item`` and ``distance`` are None, bucket ``"none"``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from keeper_bench.ledger import Ledger
from keeper_bench.phrasing import (
    OVERDRAWN,
    PROTECTED,
    UNKNOWN,
    QuestionKind,
    answer_under_rules,
    render_question,
)

Category = Literal[
    "current",
    "old",
    "who",
    "before_last",
    "count",
    "order",
    "gist",
    "rule",
    "method",
    "overdrawn",
    "unknown",
]
CATEGORIES: tuple[Category, ...] = (
    "current",
    "old",
    "who",
    "before_last",
    "count",
    "order",
    "gist",
    "rule",
    "method",
    "overdrawn",
    "unknown",
)
NEW_KINDS: tuple[QuestionKind, ...] = ("before_last", "count", "order", "gist")
"""One question of each of these at the end of every question set (after the rule, method,
overdrawn and unknown ones): they need more searches than the others, and a keeper that runs
out of searches (10 between inputs by default) then loses these, not the older kinds."""
SPAN = (5, 12)
"""How many items a count or gist question's span covers (inclusive range)."""
BUCKETS: tuple[tuple[str, int, int | None], ...] = (
    ("1–4", 1, 4),
    ("5–24", 5, 24),
    ("25–99", 25, 99),
    ("100–399", 100, 399),
    ("400+", 400, None),
)
BUCKET_LABELS: tuple[str, ...] = ("0", *(label for label, _, _ in BUCKETS), "none")
_TRIES = 40


def bucket_label(distance: int | None) -> str:
    if distance is None:
        return "none"
    if distance <= 0:
        return "0"
    for label, low, high in BUCKETS:
        if distance >= low and (high is None or distance <= high):
            return label
    raise AssertionError("unreachable")


@dataclass(frozen=True, slots=True)
class QuestionRecord:
    number: int
    kind: QuestionKind
    name: str
    item: int | None
    answer: str
    category: Category
    distance: int | None
    bucket: str
    text: str
    until: int | None = None
    """The last item of a count or gist question's span."""
    others: tuple[str, ...] = ()
    """The other counters an order or gist question names."""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "number": self.number,
            "kind": self.kind,
            "name": self.name,
            "item": self.item,
            "answer": self.answer,
            "category": self.category,
            "distance": self.distance,
            "bucket": self.bucket,
        }
        if self.until is not None:
            data["until"] = self.until
        if self.others:
            data["others"] = list(self.others)
        return data


@dataclass(frozen=True, slots=True)
class _Draft:
    kind: QuestionKind
    name: str
    item: int | None
    asked_item: int | None
    until: int | None = None
    others: tuple[str, ...] = ()
    truth: str | int | None = None
    """The answer's fact for the new kinds (a value, a count or a name), worked out when drawn."""


def _finish(draft: _Draft, number: int, ledger: Ledger, after_item: int) -> QuestionRecord:
    rules = ledger.rules
    value: int | None
    actor: str | None = None
    if draft.kind == "who":
        assert draft.asked_item is not None
        actor = ledger.first_actor(draft.name, draft.asked_item)
        value = None
    elif draft.kind in ("order", "gist"):
        actor, value = str(draft.truth), None
    elif draft.kind in ("before_last", "count"):
        value = int(draft.truth) if draft.truth is not None else None
    elif draft.kind == "old":
        assert draft.asked_item is not None
        value = ledger.value_at(draft.name, draft.asked_item)
    else:
        value = ledger.value_at(draft.name, after_item)
    answer = answer_under_rules(draft.kind, draft.name, value, rules, actor=actor)
    category: Category
    item = draft.item
    if answer == UNKNOWN:
        category = "unknown"
    elif answer == PROTECTED:
        category, item = "rule", 1
    elif answer == OVERDRAWN:
        category = "overdrawn"
    elif draft.kind == "tally":
        category = "method"
    else:
        category = draft.kind  # type: ignore[assignment]
    distance = None if item is None else after_item - item
    return QuestionRecord(
        number=number,
        kind=draft.kind,
        name=draft.name,
        item=item,
        answer=answer,
        category=category,
        distance=distance,
        bucket=bucket_label(distance),
        text=render_question(
            draft.kind, draft.name, draft.asked_item, until=draft.until, others=draft.others
        ),
        until=draft.until,
        others=draft.others,
    )


class QuestionPicker:
    """Picks question sets from a ledger that is still growing (the generator's own)."""

    def __init__(self, ledger: Ledger, rng: random.Random, *, never_used: Sequence[str]) -> None:
        self._ledger = ledger
        self._rng = rng
        self._never_used = tuple(never_used)
        self._negative: list[tuple[int, str]] = []

    def note_batch(self, item: int) -> None:
        """Remember counters that ended ``item`` below zero (for the overdrawn questions)."""
        for change in self._ledger.changes_in(item):
            if self._ledger.value_at(change.name, item) == change.value and change.value < 0:
                self._negative.append((item, change.name))

    # -- candidates ------------------------------------------------------------------------
    def _range(self, after: int, bucket: int) -> tuple[int, int]:
        _, low, high = BUCKETS[bucket]
        first = 1 if high is None else max(1, after - high)
        return first, after - low

    def _ordinary(self, name: str) -> bool:
        return name not in self._ledger.rules.confidential

    def _current(self, after: int, bucket: int) -> _Draft | None:
        first, last = self._range(after, bucket)
        names = sorted(
            n
            for n, v in self._ledger.current.items()
            if self._ordinary(n)
            and first <= (self._ledger.last_change(n) or 0) <= last
            and not (self._ledger.rules.overdrawn and v < 0)
        )
        if not names:
            return None
        name = self._rng.choice(names)
        return _Draft("current", name, self._ledger.last_change(name), None)

    def _old(self, after: int, bucket: int, *, negative: bool = False) -> _Draft | None:
        first, last = self._range(after, bucket)
        if first > last:
            return None
        for _ in range(_TRIES):
            if negative:
                pool = [(i, n) for i, n in self._negative if first <= i <= last]
                if not pool:
                    return None
                item, name = self._rng.choice(pool)
                candidates = [name]
            else:
                item = self._rng.randint(first, last)
                candidates = [c.name for c in self._ledger.changes_in(item)]
            self._rng.shuffle(candidates)
            for name in candidates:
                old = self._ledger.value_at(name, item)
                later = self._ledger.last_change(name, after)
                if (
                    self._ordinary(name)
                    and old is not None
                    and later is not None
                    and later > item
                    and old != self._ledger.value_at(name, after)
                    and (negative or not (self._ledger.rules.overdrawn and old < 0))
                ):
                    return _Draft("old", name, item, item)
        return None

    def _who(self, after: int, bucket: int) -> _Draft | None:
        first, last = self._range(after, bucket)
        if first > last:
            return None
        for _ in range(_TRIES):
            item = self._rng.randint(first, last)
            # not a confidential counter: whether "who" is a value the rule covers is ambiguous
            names = [c.name for c in self._ledger.changes_in(item) if self._ordinary(c.name)]
            if names:
                return _Draft("who", self._rng.choice(names), item, item)
        return None

    def _before_last(self, after: int, bucket: int) -> _Draft | None:
        """A counter whose last change falls in the bucket, changed at least twice, and the
        value it held before that last change (never below zero under the overdrawn rule)."""
        first, last = self._range(after, bucket)
        names = sorted(
            n
            for n in self._ledger.current
            if self._ordinary(n) and first <= (self._ledger.last_change(n, after) or 0) <= last
        )
        self._rng.shuffle(names)
        for name in names:
            changes = self._ledger.changes_of(name, after)
            if len(changes) < 2:
                continue
            before = changes[-2][1].value
            if self._ledger.rules.overdrawn and before < 0:
                continue
            return _Draft("before_last", name, changes[-1][0], None, truth=before)
        return None

    def _span(self, after: int, bucket: int) -> tuple[int, int] | None:
        first, last = self._range(after, bucket)
        width = self._rng.randint(*SPAN)
        if last - width + 1 < max(first, 1):
            return None
        start = self._rng.randint(max(first, 1), last - width + 1)
        return start, start + width - 1

    def _count(self, after: int, bucket: int) -> _Draft | None:
        """How many times a counter changed in a span of items that starts in the bucket."""
        for _ in range(_TRIES):
            span = self._span(after, bucket)
            if span is None:
                return None
            names = sorted(
                {c.name for i in range(span[0], span[1] + 1) for c in self._ledger.changes_in(i)}
            )
            names = [n for n in names if self._ordinary(n)]
            if names:
                name = self._rng.choice(names)
                count = self._ledger.count_changes(name, *span)
                return _Draft("count", name, span[0], span[0], until=span[1], truth=count)
        return None

    def _order(self, after: int, bucket: int) -> _Draft | None:
        """Two counters first recorded in different items, the earlier in the bucket."""
        first, last = self._range(after, bucket)
        starts = {n: (self._ledger.changed_items(n) or (0,))[0] for n in self._ledger.current}
        early = sorted(n for n, i in starts.items() if first <= i <= last and self._ordinary(n))
        if not early:
            return None
        name = self._rng.choice(early)
        later = sorted(
            n
            for n, i in starts.items()
            if starts[name] < i <= min(after, starts[name] + 30) and self._ordinary(n)
        )
        if not later:
            return None
        other = self._rng.choice(later)
        pair = [name, other]
        self._rng.shuffle(pair)
        return _Draft("order", pair[0], starts[name], None, others=(pair[1],), truth=name)

    def _gist(self, after: int, bucket: int) -> _Draft | None:
        """Three counters changed in a span, one of them more often than the others."""
        for _ in range(_TRIES):
            span = self._span(after, bucket)
            if span is None:
                return None
            counts: dict[str, int] = {}
            for i in range(span[0], span[1] + 1):
                for change in self._ledger.changes_in(i):
                    if self._ordinary(change.name):
                        counts[change.name] = counts.get(change.name, 0) + 1
            ranked = sorted(counts, key=lambda n: (-counts[n], n))
            if len(ranked) < 3 or counts[ranked[0]] < 2 or counts[ranked[0]] == counts[ranked[1]]:
                continue
            others = self._rng.sample(ranked[1:], 2)
            names = [ranked[0], *others]
            self._rng.shuffle(names)
            return _Draft(
                "gist",
                names[0],
                span[0],
                span[0],
                until=span[1],
                others=(names[1], names[2]),
                truth=ranked[0],
            )
        return None

    def _rule(self, after: int) -> _Draft | None:
        names = sorted(n for n in self._ledger.rules.confidential if n in self._ledger.current)
        if not names:
            return None
        name = self._rng.choice(names)
        return _Draft(
            self._rng.choice(("current", "tally")) if self._ledger.rules.tally else "current",
            name,
            1,
            None,
        )

    def _tally(self, after: int, bucket: int, *, negative: bool = False) -> _Draft | None:
        first, last = self._range(after, bucket)
        names = sorted(
            n
            for n, v in self._ledger.current.items()
            if self._ordinary(n)
            and (v <= -3 if negative else v >= 0)
            and (negative or first <= (self._ledger.last_change(n) or 0) <= last)
        )
        if not names:
            return None
        name = self._rng.choice(names)
        return _Draft("tally", name, self._ledger.last_change(name), None)

    def _overdrawn(self, after: int, turn: int) -> _Draft | None:
        ways: list[Callable[[], _Draft | None]] = [
            lambda: self._current_negative(),
            lambda: (
                self._old(after, len(BUCKETS) - 1, negative=True) or self._old_any_negative(after)
            ),
        ]
        if self._ledger.rules.tally:
            ways.append(lambda: self._tally(after, 0, negative=True))
        for offset in range(len(ways)):
            draft = ways[(turn + offset) % len(ways)]()
            if draft is not None:
                return draft
        return None

    def _current_negative(self) -> _Draft | None:
        names = sorted(n for n, v in self._ledger.current.items() if v < 0 and self._ordinary(n))
        if not names:
            return None
        name = self._rng.choice(names)
        return _Draft("current", name, self._ledger.last_change(name), None)

    def _old_any_negative(self, after: int) -> _Draft | None:
        for bucket in range(len(BUCKETS)):
            draft = self._old(after, bucket, negative=True)
            if draft is not None:
                return draft
        return None

    def _unknown(self, after: int, turn: int) -> _Draft | None:
        if turn % 2 == 0 and self._never_used:
            return _Draft(
                "current", self._never_used[turn // 2 % len(self._never_used)], None, None
            )
        for _ in range(_TRIES):
            item = self._rng.randint(1, after)
            changed = {c.name for c in self._ledger.changes_in(item)}
            existing = sorted(
                n
                for n in self._ledger.current
                if n not in changed
                and self._ordinary(n)
                and (self._ledger.last_change(n, item) or 0) > 0
            )
            if existing:
                return _Draft("who", self._rng.choice(existing), item, item)
        return None

    # -- sets --------------------------------------------------------------------------------
    def question_set(
        self,
        after: int,
        set_index: int,
        *,
        base: int,
        rules: bool,
        overdrawn: bool,
        history: bool = True,
    ) -> list[QuestionRecord]:
        fits = [i for i, (_, low, _) in enumerate(BUCKETS) if low <= after - 1]
        drafts: list[_Draft] = []
        makers: dict[str, Callable[[int], _Draft | None]] = {
            "current": lambda b: self._current(after, b),
            "old": lambda b: self._old(after, b),
            "who": lambda b: self._who(after, b),
        }
        kinds = ("current", "old", "who")
        for j in range(base):
            kind = kinds[j % 3]
            start = (set_index + j) % len(fits) if fits else 0
            for offset in range(len(fits)):
                draft = makers[kind](fits[(start + offset) % len(fits)])
                if draft is not None:
                    drafts.append(draft)
                    break
        extras: list[_Draft | None] = []
        if rules:
            extras.append(self._rule(after))
            bucket = fits[set_index % len(fits)] if fits else 0
            extras.append(self._tally(after, bucket) or self._tally(after, fits[0] if fits else 0))
        if overdrawn:
            extras.append(self._overdrawn(after, set_index))
        extras.append(self._unknown(after, set_index))
        drafts.extend(d for d in extras if d is not None)
        # the new kinds come last: a reader that runs out of searches loses them first
        more: dict[str, Callable[[int], _Draft | None]] = {
            "before_last": lambda b: self._before_last(after, b),
            "count": lambda b: self._count(after, b),
            "order": lambda b: self._order(after, b),
            "gist": lambda b: self._gist(after, b),
        }
        for j, kind in enumerate(NEW_KINDS if history else ()):
            start = (set_index + j) % len(fits) if fits else 0
            for offset in range(len(fits)):
                draft = more[kind](fits[(start + offset) % len(fits)])
                if draft is not None:
                    drafts.append(draft)
                    break
        return [_finish(d, n, self._ledger, after) for n, d in enumerate(drafts, start=1)]

    def final_questions(self, after: int, count: int) -> list[QuestionRecord]:
        """Current values of counters spread over how long ago they last changed."""
        ordinary = sorted(
            (n for n in self._ledger.current if self._ordinary(n)),
            key=lambda n: (self._ledger.last_change(n) or 0, n),
        )
        chosen: list[str] = []
        confidential = sorted(
            n for n in self._ledger.rules.confidential if n in self._ledger.current
        )
        if confidential:
            chosen.append(self._rng.choice(confidential))
        if self._ledger.rules.overdrawn:
            negative = [n for n in ordinary if self._ledger.current[n] < 0]
            if negative:
                chosen.append(self._rng.choice(negative))
        rest = [n for n in ordinary if n not in chosen]
        wanted = max(0, count - len(chosen))
        if rest and wanted:
            step = len(rest) / min(wanted, len(rest))
            chosen.extend(rest[int(i * step)] for i in range(min(wanted, len(rest))))
        self._rng.shuffle(chosen)
        drafts = [_Draft("current", n, self._ledger.last_change(n), None) for n in chosen[:count]]
        return [_finish(d, i, self._ledger, after) for i, d in enumerate(drafts, start=1)]
