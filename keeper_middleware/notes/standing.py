"""Standing rules the user stated, carried into the RULES word for word whatever the note-taker
writes (pure).

"Rules that cannot be lost" rested on the note-taker: a model that answered every note request
with prose (no change lines), or rewrote the notes without a NOTES block, left the RULES empty
after three cuts, and the rule survived only in the archive, never beside a question. So at a
cut the keeper reads the turns it notes itself: a sentence a user (or a system message) wrote
that is unmistakably a standing rule enters the RULES as written, unless the RULES already hold
it or a rewording of it.

Unmistakably standing, because a rule is repeated beside every question for good (a "rule" that
restated the task's opening instructions once overwrote a file of correct answers): the sentence
must read as an instruction (:func:`~keeper_middleware.notes.rules.looks_like_instruction`) and
either be labelled as a rule ("Rule: ...", "House method: ...") or say that it lasts ("from now
on", "always", "never", "whenever", "every time", "at all times", "going forward"). An ordinary
request ("Please fetch every site.") is no standing rule; the pinned task is in view in every
request and is never read here; question sets are not either (they change nothing).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace

from keeper_middleware.notes.block import Notes, normalise_entry
from keeper_middleware.notes.rules import IMPERATIVE_WORDS, looks_like_instruction, rewording_of

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'“(\[]?[A-Z0-9])")
_RULE_LABEL = re.compile(
    r"^\s*(?:[\w-]+\s+){0,2}(?:rule|rules|method|policy|convention|guideline|requirement)\s*:\s*",
    re.IGNORECASE,
)
_LASTING = re.compile(
    r"\b(?:from now on|always|never|whenever|every time|at all times|going forward|"
    r"for the rest of|in future|henceforth)\b",
    re.IGNORECASE,
)


_TO_YOU = re.compile(
    r"\byou\b[^.;]*\b(?:must|should|shall|need to|have to|are to|may not|may only)\b",
    re.IGNORECASE,
)
_CLAUSES = re.compile(r"[,;:]|\s[-–—]\s")
_WORD = re.compile(r"[\w']+")
_LEAD_WORDS = frozenset(
    {"from", "now", "on", "please", "always", "never", "also", "then", "going", "forward"}
)


def sentences(text: str) -> list[str]:
    """The sentences of ``text``, line by line, as written."""
    found: list[str] = []
    for line in text.splitlines():
        found += [s.strip() for s in _SENTENCE_END.split(line) if s.strip()]
    return found


def stated_rules(text: str) -> list[str]:
    """The standing rules ``text`` (what a user or a system message said) states, each as
    written; a rule label ("Standing rule:") is left off, the RULES say what they are."""
    rules: list[str] = []
    for sentence in sentences(text):
        label = _RULE_LABEL.match(sentence)
        body = sentence[label.end() :] if label is not None else sentence
        if not body or not looks_like_instruction(body):
            continue
        if label is not None or _unlabelled_rule(body):
            rules.append(body)
    return rules


def _unlabelled_rule(sentence: str) -> bool:
    """A sentence with no rule label is a standing rule only when it says it lasts and tells
    the reader what to do, as a statement: "Never give up!" and "Keep going and always smile!"
    are encouragement, and four words is the least a rule of a task takes ("Never round the
    figures.")."""
    if sentence.rstrip("\"'”’) ").endswith(("!", "?")) or len(_WORD.findall(sentence)) < 4:
        return False
    return bool(_LASTING.search(sentence)) and _addressed(sentence)


def _addressed(sentence: str) -> bool:
    """Whether a sentence tells the reader what to do ("From now on, report ...", "You must
    never ...") rather than tells of someone ("I always go hiking", "Mira never rounds")."""
    if _TO_YOU.search(sentence):
        return True
    for clause in _CLAUSES.split(sentence):
        words = [w.casefold() for w in _WORD.findall(clause)]
        while words and words[0] in _LEAD_WORDS:
            words = words[1:]
        if words and words[0] in IMPERATIVE_WORDS:
            return True
    return False


def with_stated_rules(notes: Notes, texts: Iterable[str], max_rules: int | None) -> Notes:
    """``notes`` with every standing rule ``texts`` state that the RULES do not hold yet (word
    for word or reworded) appended as written, within ``max_rules``."""
    rules = list(notes.rules)
    for text in texts:
        for rule in stated_rules(text):
            if max_rules is not None and len(rules) >= max_rules:
                return _with_rules(notes, rules)
            known = {normalise_entry(r) for r in rules}
            if normalise_entry(rule) in known or rewording_of(rule, rules) is not None:
                continue
            rules.append(rule)
    return _with_rules(notes, rules)


def _with_rules(notes: Notes, rules: list[str]) -> Notes:
    if tuple(rules) == notes.rules:
        return notes
    return replace(notes, rules=tuple(rules))
