"""Taking notes in place: ask for the changes, check them, ask again a bounded number of times.

`NoteTaking` is a pure state machine; the driver (sync or async) makes the model calls:

    session = NoteTaking(notes=notes, noted_text=text)
    step = session.first_step()              # Ask(None): send the notes request
    while isinstance(step, Ask):
        step = session.receive(call_model(step.text))
    outcome = step.outcome

What it guarantees, each from a run that went wrong:

- a rule named in any reply to one request is kept, even if a later reply leaves it out;
- a re-ask's reply replaces only the questioned lines, each by its own line for the same key when
  that passes; the lines that passed stay as first read (every reading misreads something of its
  own: a later reply taken whole traded the lines fixed for new misreads);
- when the re-asks give nothing better, the first usable reply (with the lines the re-asks
  fixed) stands without the lines the text contradicts; there is no fallback to a different path
  (a full rewrite lost a change and once added a "rule" that restated the task);
- a line the text does not contradict is never left out just because no check could follow it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from keeper_middleware.errors import ConfigurationError, InvalidStateError
from keeper_middleware.notes.block import NOTES_CHECK_TAG, NOTES_REQUEST_TAG, Notes, normalise_entry
from keeper_middleware.notes.changes import (
    Change,
    NoChanges,
    RuleLine,
    SetLine,
    UnsetLine,
    apply_and_report,
    parse_changes,
)
from keeper_middleware.notes.checks import (
    CheckContext,
    Issue,
    NoteCheck,
    compile_names,
    default_checks,
    rule_is_acceptable,
    run_checks,
)
from keeper_middleware.notes.recall import ArchivedKeys

_FORMS = """\
RULE: <text>
SET <key> = <value>
SET <key> = <value> (= <working>)
UNSET <key>
OPEN: <text>
CLOSE: <text>
NO CHANGES"""

NOTES_REQUEST_TEXT = f"""\
{NOTES_REQUEST_TAG} Write down what the turns since the NOTES changed.
Reply with change lines only, one per line, each in one of these forms:
RULE: <text> — a standing rule or method the user stated in these turns, word for word. Write a RULE line for every one; facts go in SET lines.
SET <key> = <value> — a value stated outright, without working, e.g. "recorded domo86 at six" gives SET domo86 = 6.
SET <key> = <value> (= <working>) — a worked-out value; the working uses + - * / and parentheses over amounts from the turns or the NOTES, e.g. SET domo86 = 332 (= 342 - 10).
UNSET <key> — a state entry that no longer applies.
OPEN: <text> — a new open question or task.
CLOSE: <text> — an open entry that is done.
NO CHANGES — nothing changed.
Account for every name whose value changed in these turns. Skip the messages the NOTES says were kept in view: they are already noted. Write nothing else."""

REASK_HEADER = (
    f"{NOTES_CHECK_TAG} Some lines failed a check. Write all your change lines again, "
    "correcting these:"
)
EMPTY_REASK_HEADER = (
    f"{NOTES_CHECK_TAG} Your reply had no change line in the required form. Write all your "
    "change lines again, one per line, using only these forms:"
)


def notes_request_text(kept: int = 0) -> str:
    """The notes request; ``kept`` messages after the NOTES were noted before and must be skipped."""
    if kept < 0:
        raise ConfigurationError(f"kept must be >= 0 (a number of messages), got {kept}.")
    if kept == 0:
        return NOTES_REQUEST_TEXT
    if kept == 1:
        skip = "The first message after the NOTES is already noted; do not note it again."
    else:
        skip = (
            f"The first {kept} messages after the NOTES are already noted; do not note them again."
        )
    return f"{NOTES_REQUEST_TEXT}\n{skip}"


def reask_message_text(issues: Sequence[Issue], reason_empty: bool = False) -> str:
    """The ``[NOTES CHECK]`` message (docs/formats.md §2) listing each questioned line and why."""
    lines = [EMPTY_REASK_HEADER, _FORMS] if reason_empty else []
    if issues:
        if reason_empty:
            lines.append("Also correct these:")
        else:
            lines.append(REASK_HEADER)
        for issue in issues:
            lines.append(f"- {issue.line}: {issue.reason}" if issue.line else f"- {issue.reason}")
    if not lines:
        raise ConfigurationError(
            "Nothing to ask again: give issues, or reason_empty=True for an empty reply."
        )
    return "\n".join(lines)


_SECOND_READING_ONLY = frozenset({"working_follows_text"})
"""Checks whose questions get one second reading, not every re-ask (they only question)."""


@dataclass(frozen=True, slots=True)
class NoteOutcome:
    """What one notes request came to."""

    notes: Notes
    """The notes with the accepted changes applied (unchanged when no reply was usable)."""
    changes: tuple[Change, ...]
    """The change lines applied, in order."""
    dropped: tuple[Issue, ...]
    """Lines left out, each with the issue that left it out."""
    asks: int
    """Model calls made for this request (the first ask and every re-ask)."""
    reasks: int
    """Re-asks sent."""
    garbage_lines: int
    """Lines, over all replies, that matched no change form."""
    usable: bool
    """False when no reply had a single change line: the notes are unchanged."""
    unresolved: tuple[Issue, ...] = ()
    """Questioned issues the re-asks did not resolve and that left nothing out."""
    unapplied: tuple[Change, ...] = ()
    """Applied changes that had nothing to act on (a CLOSE naming no open entry)."""

    def describe(self) -> str:
        """One sentence for a log line."""
        if not self.usable:
            return (
                f"No usable notes reply in {self.asks} call(s) ({self.garbage_lines} unreadable "
                "line(s)); the notes are unchanged."
            )
        return (
            f"{len(self.changes)} change(s) applied, {len(self.dropped)} left out, "
            f"{len(self.unresolved)} questioned and kept, in {self.asks} call(s)."
        )


@dataclass(frozen=True, slots=True)
class Ask:
    """Call the model: with the notes request (``text`` None) or with this re-ask text."""

    text: str | None


@dataclass(frozen=True, slots=True)
class Done:
    """Note-taking is over."""

    outcome: NoteOutcome


@dataclass(frozen=True, slots=True)
class _CheckedReply:
    changes: tuple[Change, ...]  # after the lines dropped at once
    dropped: tuple[Issue, ...]
    questioned: tuple[Issue, ...]


class NoteTaking:
    """One notes request and its bounded re-asks, as a state machine with no I/O."""

    def __init__(
        self,
        *,
        notes: Notes,
        noted_text: str,
        checks: Sequence[NoteCheck] | None = None,
        max_reasks: int = 2,
        tracked_names: str | re.Pattern[str] | None = None,
        instruction_text: str | None = None,
        max_rules: int | None = None,
        archived_keys: frozenset[str] | ArchivedKeys = frozenset(),
    ) -> None:
        """``instruction_text`` is what the user and the system prompt said (the only text a RULE
        may quote; None: ``noted_text``); ``max_rules`` caps the RULES (None: no cap);
        ``archived_keys`` are the STATE keys whose entries are in the archive, not the NOTES (or
        an ``ArchivedKeys`` that reads them from the archive as names come up)."""
        if max_reasks < 0:
            raise ConfigurationError(
                f"max_reasks must be >= 0, got {max_reasks}; use 0 to never ask again."
            )
        pattern = compile_names(tracked_names)
        self._notes = notes
        self._context = CheckContext(
            noted_text=noted_text,
            notes=notes,
            tracked_names=pattern,
            instruction_text=instruction_text,
            max_rules=max_rules,
            archived_keys=(
                archived_keys
                if isinstance(archived_keys, ArchivedKeys)
                else frozenset(key.casefold() for key in archived_keys)
            ),
        )
        self._checks = tuple(default_checks(pattern) if checks is None else checks)
        self._max_reasks = max_reasks
        self._started = False
        self._outcome: NoteOutcome | None = None
        self._asks = 0
        self._reasks = 0
        self._garbage = 0
        self._rules: dict[str, RuleLine] = {}
        self._first: _CheckedReply | None = None

    @property
    def outcome(self) -> NoteOutcome | None:
        """The outcome once note-taking is over, else None."""
        return self._outcome

    def first_step(self) -> Ask:
        """Start: the caller sends the notes request."""
        if self._started:
            raise InvalidStateError(
                "first_step() was already called; continue with receive(reply)."
            )
        self._started = True
        return Ask(None)

    def receive(self, reply: str) -> Ask | Done:
        """Take the model's reply; say whether to ask again or what the outcome is."""
        if not self._started:
            raise InvalidStateError(
                "Call first_step() and send the notes request before receive()."
            )
        if self._outcome is not None:
            raise InvalidStateError(
                "Note-taking is over; read .outcome instead of sending more replies."
            )
        self._asks += 1
        parsed = parse_changes(reply)
        self._garbage += len(parsed.garbage)
        for change in parsed.changes:
            if isinstance(change, RuleLine) and rule_is_acceptable(change, self._context):
                self._rules.setdefault(normalise_entry(change.text), change)
        if not parsed.usable:
            earlier = list(self._first.questioned) if self._first is not None else []
            return self._ask_again(earlier, reason_empty=True)

        checked = self._check(tuple(parsed.changes))
        if self._first is not None:
            # a second reading replaces only the questioned lines: the lines that passed stay as
            # first read (each reading misreads something of its own; taking a later reply
            # whole traded the lines fixed for new misreads in lines that had passed)
            merged = _with_answers(self._first, checked)
            checked = self._check(merged, dropped=self._first.dropped)
        self._first = checked
        if not checked.questioned:
            return self._finish(checked.changes, checked.dropped, ())
        return self._ask_again(list(checked.questioned), reason_empty=False)

    def _check(self, changes: tuple[Change, ...], dropped: tuple[Issue, ...] = ()) -> _CheckedReply:
        issues = run_checks(changes, self._context, self._checks)
        dropping = {issue.line: issue for issue in reversed(issues) if issue.action == "drop"}
        drop_now = set(dropping)
        return _CheckedReply(
            changes=tuple(c for c in changes if c.render() not in drop_now),
            dropped=dropped
            + tuple(
                dropping[line] for line in dict.fromkeys(i.line for i in issues) if line in dropping
            ),
            questioned=tuple(
                issue for issue in issues if issue.action != "drop" and issue.line not in drop_now
            ),
        )

    def give_up(self) -> Done:
        """End with what the replies so far gave, as if the re-asks had run out (used when a
        re-ask would no longer fit the window)."""
        if self._outcome is not None:
            return Done(self._outcome)
        if self._reasks > 0:
            self._reasks -= 1  # the re-ask last asked for was never sent
        self._max_reasks = self._reasks
        done = self._ask_again([], reason_empty=False)
        assert isinstance(done, Done)
        return done

    def _ask_again(self, issues: list[Issue], *, reason_empty: bool) -> Ask | Done:
        read_twice = self._reasks > 0 and bool(issues) and not reason_empty
        if read_twice and all(issue.check in _SECOND_READING_ONLY for issue in issues):
            # a line read twice and questioned both times is as likely wording no check can
            # follow as a misread: a third whole request costs more than it has been found to fix
            self._max_reasks = self._reasks
        if self._reasks < self._max_reasks:
            self._reasks += 1
            return Ask(reask_message_text(issues, reason_empty))
        first = self._first
        if first is None:
            return self._finish_unusable()
        contradicted = {i.line for i in first.questioned if i.action == "drop_if_unresolved"}
        kept = tuple(c for c in first.changes if c.render() not in contradicted)
        left_out = tuple(i for i in first.questioned if i.action == "drop_if_unresolved")
        unresolved = tuple(
            i
            for i in first.questioned
            if i.action != "drop_if_unresolved" and i.line not in contradicted
        )
        return self._finish(kept, first.dropped + left_out, unresolved)

    def _finish(
        self, changes: tuple[Change, ...], dropped: tuple[Issue, ...], unresolved: tuple[Issue, ...]
    ) -> Done:
        named = {normalise_entry(c.text) for c in changes if isinstance(c, RuleLine)}
        restored = tuple(rule for key, rule in self._rules.items() if key not in named)
        final = _within_rule_cap(changes + restored, self._notes, self._context.max_rules)
        applied, not_applied = apply_and_report(self._notes, final)
        self._outcome = NoteOutcome(
            notes=applied,
            changes=final,
            dropped=dropped,
            asks=self._asks,
            reasks=self._reasks,
            garbage_lines=self._garbage,
            usable=True,
            unresolved=unresolved,
            unapplied=tuple(not_applied),
        )
        return Done(self._outcome)

    def _finish_unusable(self) -> Done:
        self._outcome = NoteOutcome(
            notes=self._notes,
            changes=(),
            dropped=(),
            asks=self._asks,
            reasks=self._reasks,
            garbage_lines=self._garbage,
            usable=False,
        )
        return Done(self._outcome)


def _key_of(change: Change) -> str | None:
    return change.key if isinstance(change, SetLine | UnsetLine) else None


def _with_answers(standing: _CheckedReply, answer: _CheckedReply) -> tuple[Change, ...]:
    """The standing lines with each questioned one replaced by the answer's line for the same
    key when that line passes (or left out when the answer withdraws a line the text
    contradicts), and, when the reply
    as a whole was questioned (a name not accounted for), the answer's passing lines for keys
    the standing lines lack."""
    questioned_lines = {issue.line for issue in standing.questioned}
    contradicted = {i.line for i in standing.questioned if i.action == "drop_if_unresolved"}
    questioned = {
        key
        for change in standing.changes
        if change.render() in questioned_lines and (key := _key_of(change)) is not None
    }
    whole = any(not issue.line for issue in standing.questioned)
    failing = {issue.line for issue in answer.questioned}
    passing: dict[str, Change] = {}
    offered: set[str] = set()
    for change in answer.changes:
        key = _key_of(change)
        if key is None:
            continue
        offered.add(key)
        if change.render() not in failing:
            passing[key] = change
    held = {key for change in standing.changes if (key := _key_of(change)) is not None}
    merged: list[Change] = []
    for change in standing.changes:
        key = _key_of(change)
        if key is None or key not in questioned:
            merged.append(change)
        elif key in passing:
            merged.append(passing[key])
        elif key in offered or change.render() not in contradicted:
            # the answer's line fails too, or the answer is silent on a line the text does
            # not contradict: the first reading stands
            merged.append(change)
    if whole:
        added: list[Change] = [change for key, change in passing.items() if key not in held]
        if added:
            merged = [c for c in merged if not isinstance(c, NoChanges)]
            merged.extend(added)
    return tuple(merged)


def _within_rule_cap(
    changes: tuple[Change, ...], notes: Notes, max_rules: int | None
) -> tuple[Change, ...]:
    """The changes with the RULE lines past the cap left out (the rules held stay)."""
    if max_rules is None:
        return changes
    held = {normalise_entry(rule) for rule in notes.rules}
    room = max(0, max_rules - len(notes.rules))
    kept: list[Change] = []
    for change in changes:
        if isinstance(change, RuleLine) and normalise_entry(change.text) not in held:
            if room == 0:
                continue
            room -= 1
            held.add(normalise_entry(change.text))
        kept.append(change)
    return tuple(kept)
