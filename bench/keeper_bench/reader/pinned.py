"""Reading a self-editing arm's pinned state: the lines the reader wrote for itself.

The pinned message starts with its tag, the arm's instructions and a line saying how far reading
has got ("Read up to item N."); after a blank line come the lines the model wrote: ``RULE:``
lines, ``name value`` lines, or free prose. Prose is read back with the same parser as the story
(``text``): a value the parser cannot read back from the prose is not there for the reader.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from keeper_bench.reader.text import open_recount, read_events
from keeper_middleware.notes.block import Notes

PINNED_TAG = "[PINNED STATE]"
RULE_PREFIX = "RULE:"
RULES_READ_SENTENCE = "Read the RULE: lines before answering."
_READ_UP_TO = re.compile(r"Read up to item (\d+)\.")
_USED = re.compile(r"(\d+) of (\d+) tokens used\.")
_LINE = re.compile(r"^(\S+) (-?\d+)\b")


@dataclass(frozen=True, slots=True)
class PinnedView:
    """The pinned state as the reader takes it in."""

    through_item: int
    used: int
    budget: int
    rules: tuple[str, ...]
    lines: tuple[tuple[str, str], ...]
    """``name value`` lines as written, the one set least recently first."""
    prose: tuple[str, ...]
    reads_rules: bool
    """The instructions say to read the RULE: lines before answering."""

    def recount_lines(self) -> list[str]:
        """The lines, as written, that keep a recount begun and not yet finished."""
        return _recount_lines(self)

    def open_recounts(self) -> list[str]:
        """Each recount those lines keep open, as a sentence (its result comes next item)."""
        found = (open_recount(line) for line in _recount_lines(self))
        return list(dict.fromkeys(recount.sentence() for recount in found if recount))

    def values(self) -> dict[str, int]:
        """Each counter's value: from its ``name value`` line, or the last prose sentence that
        states one (read with the story parser)."""
        found: dict[str, int] = {}
        for name, value in self.lines:
            match = _LINE.match(f"{name} {value}")
            if match is not None:
                found[name] = int(match.group(2))
        for line in self.prose:
            for event in read_events(line):
                if event.kind == "set" and event.amount is not None:
                    found[event.name] = event.amount
        return found


def _recount_lines(view: PinnedView) -> list[str]:
    texts = [value for _, value in view.lines] + list(view.prose)
    return [text for text in texts if open_recount(text) is not None]


def is_pinned_text(text: str) -> bool:
    return text.lstrip().startswith(PINNED_TAG)


def read_pinned(text: str) -> PinnedView:
    head, _, body = text.partition("\n\n")
    through = _READ_UP_TO.search(head)
    used = _USED.search(head)
    rules: list[str] = []
    lines: list[tuple[str, str]] = []
    prose: list[str] = []
    for raw in body.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith(RULE_PREFIX):
            rules.append(line[len(RULE_PREFIX) :].strip())
        elif _LINE.match(line):
            name, _, value = line.partition(" ")
            lines.append((name, value.strip()))
        else:
            prose.append(line)
    return PinnedView(
        through_item=int(through.group(1)) if through else 0,
        used=int(used.group(1)) if used else 0,
        budget=int(used.group(2)) if used else 0,
        rules=tuple(rules),
        lines=tuple(lines),
        prose=tuple(prose),
        reads_rules=RULES_READ_SENTENCE in head,
    )


def pinned_notes(text: str) -> Notes:
    """The pinned state as NOTES the reader's logic already knows how to use: its rules, each
    counter's value, accounting for the items read so far."""
    view = read_pinned(text)
    through = view.through_item
    state = tuple((name, str(value)) for name, value in view.values().items())
    still_open = tuple(view.open_recounts())
    try:
        rules = tuple(dict.fromkeys(view.rules))
        return Notes(
            rules=rules,
            state=state,
            open=still_open,
            first_item=1 if through else None,
            last_item=through or None,
        )
    except ValueError:  # a rule line the NOTES could not hold: its text is still read for rules
        return Notes(
            state=state,
            open=still_open,
            first_item=1 if through else None,
            last_item=through or None,
        )
