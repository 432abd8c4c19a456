"""What may become a RULE: an instruction someone gave, not a fact and not a rewording.

Rules are repeated next to every question and can never be removed, so a line that enters the
RULES by mistake is followed for ever (a measured run followed a "rule" that restated the task and
overwrote a file of correct answers). Three tests keep them honest, all pure:

- the line is an instruction (`looks_like_instruction`): labelled as a rule or method, phrased as
  a command, or a general statement about any/every thing; "Ada Fenn recorded domo07 at 36" and
  "the" are not;
- it is quoted from what the user or the system prompt said (the caller passes that text; model
  replies and tool output never count);
- it does not say an existing rule in other words (`is_rewording`): a rewording never replaces a
  rule or sits beside it.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

from keeper_middleware.notes.block import normalise_entry
from keeper_middleware.notes.numbers import amounts_in

MAX_RULE_CHARS = 500
"""The longest rule line: a rule is one instruction, not a pasted document."""
REWORDING_RATIO = 0.6
"""difflib similarity (on normalised text) above which a new rule is a rewording of an old one."""

_WORD = re.compile(r"\w+")
_LABEL = re.compile(r"^\s*(?P<label>[^:]{1,40}):\s*\S")
_LABEL_WORDS = frozenset(
    {
        "rule", "rules", "method", "methods", "policy", "instruction", "instructions",
        "requirement", "requirements", "convention", "guideline", "guidelines", "important",
        "constraint", "procedure", "standard",
    }
)  # fmt: skip
_DIRECTIVE = re.compile(
    r"\b(?:must|should|shall|always|never|do not|don't|does not|please|make sure|ensure|"
    r"remember to|be sure|need to|needs to|have to|has to|is to|are to|whenever|from now on|"
    r"at all times|instead of|is reported|are reported|is written|are written|is treated|"
    r"are treated|is computed|is calculated|is defined|is worked out|may not|may only|only ever)\b",
    re.IGNORECASE,
)
_IMPERATIVES = frozenset(
    {
        "answer", "report", "use", "write", "keep", "call", "reply", "respond", "treat", "give",
        "say", "follow", "avoid", "return", "include", "list", "mark", "count", "round",
        "format", "put", "send", "ask", "check", "run", "state", "show", "stop", "refer",
        "spell", "quote", "cite", "omit", "skip", "ignore", "leave", "tell", "let", "make",
        "note", "record", "convert", "express", "sort", "label", "prefix", "begin", "start",
        "do", "don't", "be", "compute", "calculate", "multiply", "divide", "subtract",
        "translate", "summarise", "summarize", "mention", "display", "print", "log", "save",
        "store", "delete", "remove", "rename", "commit", "test", "read", "open", "close",
        "update", "prefer", "add", "end", "sign", "address", "greet", "confirm", "verify",
        "escalate", "flag", "respect", "obey", "apply", "double", "halve",
    }
)  # fmt: skip
IMPERATIVE_WORDS = _IMPERATIVES
"""First words that make a clause a command ("Report negatives as ...")."""
_CLAUSE = re.compile(r"[:;]|\s[-–—]\s")
_GENERIC_SUBJECT = re.compile(
    r"^(?:a|an|any|every|each|all|no|whatever|whoever)\s+[^.;]*?\b(?:is|are|counts?|means?|"
    r"equals?|goes|go|becomes?|gets?|takes?)\b",
    re.IGNORECASE,
)


def looks_like_instruction(text: str) -> bool:
    """Whether a line reads as an instruction rather than a statement of fact.

    Deliberately simple and explainable: a label ("Standing rule:", "House method:"), a command
    word ("always", "must", "do not"), an imperative first word ("Report negatives as ..."), or a
    general statement about any/every thing ("Any figure below zero is reported as ...").
    """
    stripped = text.strip().strip("\"'“”‘’ ")
    words = _WORD.findall(stripped)
    if len(words) < 2 or len(stripped) > MAX_RULE_CHARS:
        return False  # "the" is no rule; "Never round." is
    label = _LABEL.match(stripped)
    if label is not None:
        label_words = {w.casefold() for w in _WORD.findall(label.group("label"))}
        if label_words & _LABEL_WORDS:
            return True
        stripped = stripped[label.end() - 1 :]
        words = _WORD.findall(stripped) or words
    if _DIRECTIVE.search(stripped):
        return True
    for clause in _CLAUSE.split(stripped):
        first = _WORD.findall(clause)[:1]
        if first and first[0].casefold() in _IMPERATIVES:
            return True
    return _GENERIC_SUBJECT.match(stripped) is not None


def _words(text: str) -> set[str]:
    return set(_WORD.findall(normalise_entry(text)))


def is_rewording(new: str, old: str) -> bool:
    """Whether ``new`` says ``old`` in other words: close text, or the same numbers and most words.

    Rules whose amounts differ are different rules ("times five" is not "times six").
    """
    a, b = normalise_entry(new), normalise_entry(old)
    if a == b:
        return True
    new_amounts, old_amounts = amounts_in(a), amounts_in(b)
    if new_amounts and old_amounts and new_amounts != old_amounts:
        return False
    if difflib.SequenceMatcher(None, a, b).ratio() >= REWORDING_RATIO:
        return True
    words_new, words_old = _words(a), _words(b)
    shared = len(words_new & words_old) / max(len(words_new), len(words_old), 1)
    if bool(old_amounts) and new_amounts == old_amounts and shared >= 0.5:
        return True
    # a shortened restatement: nearly every word of the new line is in the old rule
    return len(words_new) >= 3 and len(words_new & words_old) >= 0.8 * len(words_new)


def rewording_of(new: str, rules: Iterable[str]) -> str | None:
    """The existing rule ``new`` restates (word for word or in other words), or None."""
    return next((rule for rule in rules if is_rewording(new, rule)), None)


_OPENS = (".", "!", "?", ":", ";", '"', "“", "(", "-", "–", "—", "*")
_CLOSES = frozenset('.!?;:"”)')


def quoted_in(rule: str, source_text: str) -> bool:
    """Whether ``rule`` copies a whole sentence or clause of ``source_text``, word for word (case
    and spacing aside): a fragment cut out of a sentence is not a quote of it."""
    wanted = normalise_entry(rule).strip("\"'“”‘’ ")
    if not wanted:
        return False
    for line in source_text.splitlines():
        folded = " ".join(line.casefold().split())
        start = folded.find(wanted)
        while start != -1:
            end = start + len(wanted)
            opens = start == 0 or folded[:start].rstrip().endswith(_OPENS)
            closes = end == len(folded) or folded[end] in _CLOSES
            if opens and closes:
                return True
            start = folded.find(wanted, start + 1)
    return False
