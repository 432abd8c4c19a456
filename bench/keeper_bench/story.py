"""The story material: counter names, actors, filler sentences and each batch's changes.

Filler is composed from word lists that contain no digits, no number words and no counter names,
so any sentence built from them is safe (``check_vocabulary`` proves it once, not per sentence).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from keeper_bench.ledger import Ledger, LedgerChange
from keeper_bench.phrasing import (
    CHAIN_LEADS,
    CHAIN_TEMPLATES,
    CLERK,
    CLERK_TEMPLATE,
    CORRECTION_TEMPLATE,
    DECOY_TEMPLATES,
    HELD_TEMPLATES,
    NAME_RE,
    PLAIN_TEMPLATES,
    PRONOUN_TEMPLATES,
    SPLIT_END_TEMPLATE,
    SPLIT_START_TEMPLATE,
    VARIED_TEMPLATES,
    Event,
    EventKind,
    apply_change,
    fill,
    render_change,
)
from keeper_middleware.notes.numbers import amounts_in

_Commit = Callable[[Event, str], None]
_Apply = Callable[[Event], None]
_Value = Callable[[str], "int | None"]

FIRST_NAMES = [
    "Mira",
    "Tomas",
    "Ada",
    "Bruno",
    "Celia",
    "Dario",
    "Elin",
    "Felix",
    "Greta",
    "Hugo",
    "Ines",
    "Jonas",
    "Kira",
    "Lukas",
    "Maren",
    "Nils",
    "Oona",
    "Pavel",
    "Rosa",
    "Stellan",
    "Thea",
    "Viktor",
    "Wanda",
    "Yara",
]
LAST_NAMES = [
    "Holt",
    "Quill",
    "Lind",
    "Marsh",
    "Brandt",
    "Okafor",
    "Varga",
    "Pike",
    "Sorel",
    "Tamm",
    "Wren",
    "Aske",
    "Dunmore",
    "Fell",
    "Garrow",
    "Hale",
    "Ivers",
    "Kestrel",
    "Lowe",
    "Morrow",
    "Nash",
    "Orme",
    "Pruitt",
    "Rook",
]

_ADJ = [
    "quiet",
    "old",
    "narrow",
    "bright",
    "damp",
    "windy",
    "crowded",
    "empty",
    "dusty",
    "green",
    "silver",
    "sleepy",
    "busy",
    "cold",
    "warm",
    "crooked",
    "painted",
    "distant",
    "muddy",
    "salty",
]
_NOUN = [
    "ferryman",
    "baker",
    "miller",
    "weaver",
    "cat",
    "goat",
    "porter",
    "cook",
    "fisherman",
    "gardener",
    "tailor",
    "carter",
    "shepherd",
    "lamplighter",
    "potter",
    "stranger",
    "child",
    "widow",
    "peddler",
    "smith",
]
_VERB = [
    "walked",
    "wandered",
    "hurried",
    "drifted",
    "strolled",
    "marched",
    "limped",
    "rode",
    "paddled",
    "climbed",
    "ran",
    "sauntered",
]
_PREP = ["towards", "past", "along", "behind", "beside", "through", "across", "around"]
_PLACE = [
    "harbour",
    "market",
    "bridge",
    "orchard",
    "mill",
    "chapel",
    "square",
    "lighthouse",
    "granary",
    "meadow",
    "quay",
    "tannery",
    "forge",
    "well",
    "garden",
    "cottage",
    "barn",
    "ferry",
    "landing",
]
_TIMES = (
    "at dawn",
    "at dusk",
    "before supper",
    "after the storm",
    "in the rain",
    "under a grey sky",
    "as the bells rang",
    "while the tide turned",
    "late in the evening",
    "early that morning",
)
_STUFF = [
    "tar",
    "bread",
    "smoke",
    "apples",
    "rope",
    "lavender",
    "fish",
    "salt",
    "wool",
    "pine",
    "resin",
    "onions",
    "soap",
    "cider",
    "hay",
    "leather",
]
_SOUND = (
    "a gull cried",
    "a door banged",
    "the wind rose",
    "a dog barked",
    "the kettle sang",
    "thunder rolled far off",
    "the river ran high",
    "a cart creaked by",
)
_PATTERNS = (
    "The {adj} {noun} {verb} {prep} the {place} {time}.",
    "{Time}, the {noun} {verb} {prep} the {adj} {place}.",
    "The {place} smelled of {stuff} and {stuff_b}.",
    "Somewhere near the {place}, {sound}.",
    "The {noun} carried {stuff} to the {adj} {place}.",
    "Nobody at the {place} spoke of the {noun} {time}.",
    "The {noun} and the {noun_b} shared {stuff} by the {place}.",
)


def check_vocabulary() -> list[str]:
    """Every filler word or name that could be read as an amount or a counter name (should be [])."""
    words = [
        *FIRST_NAMES,
        *LAST_NAMES,
        *_ADJ,
        *_NOUN,
        *_VERB,
        *_PREP,
        *_PLACE,
        *_TIMES,
        *_STUFF,
        *_SOUND,
        *_PATTERNS,
    ]
    return [w for w in words if amounts_in(w) or NAME_RE.search(w) or any(c.isdigit() for c in w)]


class NameMaker:
    """Unique counter names: 3–7 letters from consonant–vowel syllables, then two digits."""

    _CONSONANTS = "bdfgklmnprstvz"
    _VOWELS = "aeiou"

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._used: set[str] = set()

    def new(self) -> str:
        while True:
            letters = "".join(
                self._rng.choice(self._CONSONANTS) + self._rng.choice(self._VOWELS)
                for _ in range(self._rng.randint(2, 3))
            )
            if self._rng.random() < 0.3:
                letters += self._rng.choice(self._CONSONANTS)
            name = f"{letters[:7]}{self._rng.randint(0, 99):02d}"
            if name not in self._used and NAME_RE.fullmatch(name):
                self._used.add(name)
                return name


class FillerWriter:
    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def sentence(self) -> str:
        choice = self._rng.choice
        time = choice(_TIMES)
        return choice(_PATTERNS).format(
            adj=choice(_ADJ),
            noun=choice(_NOUN),
            noun_b=choice(_NOUN),
            verb=choice(_VERB),
            prep=choice(_PREP),
            place=choice(_PLACE),
            time=time,
            Time=time[:1].upper() + time[1:],
            stuff=choice(_STUFF),
            stuff_b=choice(_STUFF),
            sound=choice(_SOUND),
        )


class ChangeWriter:
    """Chooses each batch's changes, renders them, and works out the values they leave."""

    def __init__(
        self,
        rng: random.Random,
        names: NameMaker,
        ledger: Ledger,
        *,
        families: frozenset[str],
        per_batch: int,
    ) -> None:
        self._rng = rng
        self._names = names
        self._ledger = ledger
        self._harder = "harder" in families
        self._adversarial = "adversarial" in families
        self._overdrawn = "overdrawn" in families
        self._varied = "varied" in families
        self._split: tuple[str, str, int] | None = None
        """A recount begun in the previous item: (name, actor, amount), told in this one."""
        self.carried_in: str | None = None
        """The sentence that finishes a change begun in the previous item: it opens the story."""
        self.carried_out: str | None = None
        """The sentence that begins a change finished in the next item: it closes the story."""
        self._per_batch = per_batch
        self._all: list[str] = []
        self._known: set[str] = set()
        self._recent: list[str] = []
        self._decoys: dict[int, list[tuple[EventKind, str, int]]] = {}

    def _actor(self) -> str:
        return f"{self._rng.choice(FIRST_NAMES)} {self._rng.choice(LAST_NAMES)}"

    def batch(
        self, item: int, *, first: Sequence[str] = ()
    ) -> tuple[list[str], list[LedgerChange]]:
        """The rendered change units of ``item`` in story order, and the changes they make."""
        rng = self._rng
        local: dict[str, int] = {}
        units: list[str] = []
        applied: list[LedgerChange] = []
        touched: set[str] = set()

        def value(name: str) -> int | None:
            return local[name] if name in local else self._ledger.current.get(name)

        def commit(event: Event, template: str) -> None:
            units.append(render_change(event, template, words=rng.random() < 0.5))
            apply(event)

        def apply(event: Event) -> None:
            source_value = value(event.source) if event.source else None
            new = apply_change(value(event.name), event, source_value)
            assert new is not None
            amount = event.amount if event.amount is not None else source_value
            assert amount is not None
            applied.append(
                LedgerChange(event.name, event.kind, amount, event.source, event.actor, new)
            )
            local[event.name] = new
            touched.add(event.name)
            if event.name not in self._known:
                self._known.add(event.name)
                self._all.append(event.name)
            self._recent = [*[n for n in self._recent if n != event.name], event.name][-16:]

        self.carried_in = self.carried_out = None
        if self._split is not None:
            name, actor, amount = self._split
            self._split = None
            self.carried_in = fill(SPLIT_END_TEMPLATE, amount=amount, words=rng.random() < 0.5)
            apply(Event("set", name, amount, None, actor))
        for name in first:
            commit(
                Event("set", name, rng.randint(1, 999), None, self._actor()),
                PLAIN_TEMPLATES["set"][0],
            )
        for kind, name, amount in self._decoys.pop(item, []):
            commit(Event(kind, name, amount, None, self._actor()), DECOY_TEMPLATES[kind][0])
        count = max(1, self._per_batch + rng.choice((-1, 0, 0, 1))) - len(touched)
        for _ in range(max(0, count)):
            recent = [n for n in self._recent if n not in touched] if rng.random() < 0.75 else []
            chosen = rng.choice(recent) if recent else self._pick(lambda n: n not in touched)
            if len(self._all) < 8 or rng.random() < 0.12 or chosen is None:
                self._introduce(item, commit)
            elif self._varied and rng.random() < 0.6:
                self._varied_change(chosen, value, apply, units, touched)
            else:
                self._change(chosen, value, commit)
        return units, applied

    def _pick(self, wanted: Callable[[str], bool]) -> str | None:
        """A counter chosen uniformly among all so far (a few tries: cold counters stay cold)."""
        for _ in range(8):
            if not self._all:
                return None
            name = self._rng.choice(self._all)
            if wanted(name):
                return name
        return None

    def _set_amount(self) -> int:
        """1–999; in the overdrawn family often small, so that a take can push it below zero."""
        if self._overdrawn and self._rng.random() < 0.3:
            return self._rng.randint(1, 60)
        return self._rng.randint(1, 999)

    def _introduce(self, item: int, commit: _Commit) -> None:
        name = self._names.new()
        template = self._rng.choice(PLAIN_TEMPLATES["set"])
        actor = CLERK if template == CLERK_TEMPLATE else self._actor()
        amount = self._set_amount()
        commit(Event("set", name, amount, None, actor), template)
        if self._adversarial and self._rng.random() < 0.3:
            lost = item + self._rng.randint(1, 6)
            loss = self._rng.randint(1, 99)
            self._decoys.setdefault(lost, []).append(("take", name, loss))
            self._decoys.setdefault(lost + self._rng.randint(1, 6), []).append(("add", name, loss))

    def _kind_and_amount(self, current: int | None) -> tuple[EventKind, int]:
        rng = self._rng
        roll = rng.random()
        kind: EventKind = "set" if roll < 0.25 else "add" if roll < 0.65 else "take"
        amount = self._set_amount() if kind == "set" else rng.randint(1, 99)
        if (
            kind == "take"
            and self._overdrawn
            and current is not None
            and 0 < current < 90
            and rng.random() < 0.5
        ):
            amount = min(99, current + rng.randint(1, 9))  # push it below zero
        return kind, amount

    def _varied_change(
        self, name: str, value: _Value, apply: _Apply, units: list[str], touched: set[str]
    ) -> None:
        """One change (or a chain of them) in a phrasing of the varied family."""
        rng = self._rng
        style = rng.random()
        kind, amount = self._kind_and_amount(value(name))
        actor = self._actor()
        if style < 0.4:
            template = rng.choice(VARIED_TEMPLATES[kind])
            units.append(fill(template, name=name, actor=actor, amount=amount, words=_words(rng)))
            apply(Event(kind, name, amount, None, actor))
        elif style < 0.6:
            wrong = amount + rng.randint(1, 9) * rng.choice((-1, 1))
            if wrong < 1:
                wrong = amount + rng.randint(1, 9)
            template = rng.choice((*PLAIN_TEMPLATES[kind][:1], *VARIED_TEMPLATES[kind]))
            said = fill(template, name=name, actor=actor, amount=wrong, words=_words(rng))
            fixed = fill(CORRECTION_TEMPLATE, amount=amount, words=_words(rng))
            units.append(f"{said} {fixed}")
            apply(Event(kind, name, amount, None, actor))
        elif style < 0.85 or self._split is not None:
            sentences = [fill(rng.choice(CHAIN_LEADS), name=name)]
            for link in range(rng.randint(2, 3)):
                if link:
                    kind, amount = self._kind_and_amount(value(name))
                    actor = self._actor()
                template = rng.choice(CHAIN_TEMPLATES[kind])
                words = _words(rng)
                sentences.append(fill(template, actor=actor, amount=amount, words=words))
                apply(Event(kind, name, amount, None, actor))
            units.append(" ".join(sentences))
        else:
            self._split = (name, actor, self._set_amount())
            self.carried_out = fill(SPLIT_START_TEMPLATE, name=name, actor=actor)
            touched.add(name)  # nothing else happens to it after the recount begins

    def _change(self, name: str, value: _Value, commit: _Commit) -> None:
        rng = self._rng
        kind, amount = self._kind_and_amount(value(name))
        if self._harder and rng.random() < 1 / 3:
            source = self._pick(lambda n: n != name and abs(value(n) or 1000) < 1000)
            if kind != "set" and source is not None and rng.random() < 0.5:
                held: EventKind = "add_held" if kind == "add" else "take_held"
                commit(Event(held, name, None, source, self._actor()), HELD_TEMPLATES[held][0])
            else:
                commit(Event(kind, name, amount, None, self._actor()), PRONOUN_TEMPLATES[kind][0])
            return
        template = rng.choice(PLAIN_TEMPLATES[kind])
        if template.startswith("{Amount}") and amount == 1:
            template = PLAIN_TEMPLATES[kind][0]  # "1 were taken" reads wrong
        actor = CLERK if template == CLERK_TEMPLATE else self._actor()
        commit(Event(kind, name, amount, None, actor), template)


def _words(rng: random.Random) -> bool:
    """Amounts in words about half the time."""
    return rng.random() < 0.5
