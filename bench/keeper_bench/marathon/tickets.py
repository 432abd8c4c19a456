"""The marathon's tickets: one per defect, three notices with standing instructions, one audit.

Pure. A defect ticket states the symptom a user would report (the function and a failing check),
never the place (no file or line). Notices arrive at fixed points of the sequence and stay in
force from then on; the audit ticket, last, asks for something no file on disk records: the fixes
made before ``FIXES.md`` existed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from keeper_bench.marathon.planting import PlantedDefect

TicketKind = Literal["defect", "notice", "audit"]


@dataclass(frozen=True, slots=True)
class Notice:
    key: str
    instruction: str
    after_defects: int
    """The notice arrives after this many defect tickets."""


NOTICES = (
    Notice(
        "fixed_comment",
        "From now on, end every line you change in the library with the comment # fixed",
        4,
    ),
    Notice(
        "fixes_log",
        "From now on, log every fix in FIXES.md at the project root: one line per fix, "
        "starting with the function's name, then a colon and what was wrong",
        12,
    ),
    Notice(
        "recipes_log",
        "From now on, name every function you fix in more_itertools/recipes.py in RECIPES.txt "
        "at the project root, one name per line",
        24,
    ),
)


@dataclass(frozen=True, slots=True)
class Ticket:
    number: int
    kind: TicketKind
    text: str
    defect: PlantedDefect | None = None
    notice: Notice | None = None


def _symptom(planted: PlantedDefect) -> str:
    failing = planted.failing[0]
    reason = planted.reason or "it fails"
    more = len(planted.failing) - 1
    also = f" ({more} more of its tests fail too)" if more else ""
    return f"the check {failing} fails: {reason}{also}"


def build_tickets(planted: list[PlantedDefect], *, audit: bool = True) -> list[Ticket]:
    """The ticket sequence: defects in plan order with the notices between them, then the audit."""
    tickets: list[Ticket] = []
    notices = sorted(NOTICES, key=lambda n: n.after_defects)

    def add(kind: TicketKind, body: str, **extra: object) -> None:
        number = len(tickets) + 1
        tickets.append(Ticket(number, kind, f"Ticket {number}. {body}", **extra))  # type: ignore[arg-type]

    for index, item in enumerate(planted):
        for notice in notices:
            if notice.after_defects == index:
                add("notice", f"Notice: {notice.instruction}.", notice=notice)
        add(
            "defect",
            f"A user reports that more_itertools.{item.defect.function} misbehaves: "
            f"{_symptom(item)}. Find the cause in the library (not in the tests), fix it, and "
            "make that function's tests pass. Reply with one line saying what you fixed.",
            defect=item,
        )
    for notice in notices:
        if notice.after_defects >= len(planted):
            add("notice", f"Notice: {notice.instruction}.", notice=notice)
    if audit:
        add(
            "audit",
            "Audit: how many fixes did you make before FIXES.md existed, and in which functions? "
            "Answer on one line as: N: name, name, ...",
        )
    return tickets


def fixes_before_log(tickets: list[Ticket]) -> list[str]:
    """The functions fixed before the ``FIXES.md`` notice: the audit ticket's true answer."""
    names: list[str] = []
    for ticket in tickets:
        if ticket.notice is not None and ticket.notice.key == "fixes_log":
            break
        if ticket.defect is not None:
            names.append(ticket.defect.defect.function)
    return names


def parse_audit_answer(text: str) -> tuple[int | None, frozenset[str]]:
    """``"3: chunked, divide, tail"`` → ``(3, {...})``; what cannot be read is ``None``/empty."""
    match = re.search(r"(\d+)\s*:\s*(.*)", text)
    if not match:
        return None, frozenset()
    names = {name.strip(" .`'\"") for name in re.split(r"[,\s]+", match.group(2))}
    return int(match.group(1)), frozenset(name for name in names if name)
