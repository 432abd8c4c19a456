"""A tiny scripted "model" for core tests: it reads a simple story format and behaves well.

Story lines: "Item N. ... set NAME to AMOUNT." / "added AMOUNT to NAME." / "Rule: TEXT".
Note requests get correct change lines (with working) for the turns after the NOTES; questions get
"1. <value>" from the NOTES and the turns in view. Faults are switched on per test.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from langchain_core.messages import AIMessage, BaseMessage

from keeper_middleware.messages.facts import keeper_kind, text_of
from keeper_middleware.notes.block import parse_notes
from keeper_middleware.notes.recall import parse_recall_block

SET = re.compile(r"set (\w+) to (-?\d+)")
ADD = re.compile(r"added (\d+) to (\w+)")
RULE = re.compile(r"Rule: ([^\n]+)")


def noted_messages(messages: list[BaseMessage]) -> tuple[dict[str, int], list[BaseMessage]]:
    """The NOTES state and the messages after it that are not yet noted."""
    state: dict[str, int] = {}
    start = 1 if messages and messages[0].type == "system" else 0
    for index, message in enumerate(messages):
        if keeper_kind(message) == "notes":
            notes, kept = parse_notes(text_of(message))
            state = {k: int(v) for k, v in notes.state}
            start = index + 1 + kept
    body = [m for m in messages[start:] if keeper_kind(m) is None]
    return state, body


def note_lines(
    messages: list[BaseMessage], recalled: tuple[tuple[str, str], ...] = ()
) -> list[str]:
    """Change lines for the turns after the NOTES; ``recalled`` entries (brought back by the
    notes request from the archive) count as held, like the NOTES' own."""
    state, body = noted_messages(messages)
    for key, value in recalled:
        state.setdefault(key, int(value))
    lines: list[str] = []
    for message in body:
        text = text_of(message)
        for rule in RULE.findall(text):
            lines.append(f"RULE: {rule.strip()}")
        events = [(m.start(), "set", m.group(1), int(m.group(2))) for m in SET.finditer(text)]
        events += [(m.start(), "add", m.group(2), int(m.group(1))) for m in ADD.finditer(text)]
        for _, kind, name, amount in sorted(events):
            if kind == "set":
                state[name] = amount
                lines.append(f"SET {name} = {amount}")
            elif name in state:
                before = state[name]
                state[name] = before + amount
                lines.append(f"SET {name} = {state[name]} (= {before} + {amount})")
    return lines or ["NO CHANGES"]


@dataclass
class StoryModel:
    """Callable reply function for ``ScriptedChatModel(default=StoryModel())``."""

    drop_rules_first: bool = False
    invent_working_first: bool = False
    empty_notes_replies: int = 0
    garbage_first: bool = False
    note_requests: list[list[BaseMessage]] = field(default_factory=list)
    answer: Callable[[list[BaseMessage]], str] | None = None
    hook: Callable[[list[BaseMessage]], None] | None = None
    """Called first on every request (tests use it to inject crashes)."""

    def __call__(self, messages: list[BaseMessage]) -> AIMessage | str:
        if self.hook is not None:
            self.hook(messages)
        last = messages[-1]
        kind = keeper_kind(last)
        if kind == "notes_request":
            self.note_requests.append(messages)
            if self.empty_notes_replies > 0:
                self.empty_notes_replies -= 1
                return ""
            lines = note_lines(messages[:-1], parse_recall_block(text_of(last)))
            if self.garbage_first:
                self.garbage_first = False
                return "Here are my thoughts about the story.\nIt was long."
            if self.drop_rules_first:
                self.drop_rules_first = False
                kept = [ln for ln in lines if not ln.startswith("RULE")]
                return "\n".join([*kept, "SET ghost99 = 5 (= 650 - 27)"])
            if self.invent_working_first:
                self.invent_working_first = False
                lines = [
                    re.sub(
                        r"^SET (\w+) = (-?\d+)$",
                        lambda m: (
                            f"SET {m.group(1)} = {m.group(2)} (= {int(m.group(2)) + 650} - 650)"
                        ),
                        ln,
                    )
                    for ln in lines
                ]
            return "\n".join(lines)
        if kind == "notes_reask":
            before = _before_request(messages)
            recalled = parse_recall_block(text_of(messages[len(before)]))
            return "\n".join(note_lines(before, recalled))
        if self.answer is not None and _asks(messages):
            return self.answer(messages)
        return "ok"


def _before_request(messages: list[BaseMessage]) -> list[BaseMessage]:
    for index in range(len(messages) - 1, -1, -1):
        if keeper_kind(messages[index]) == "notes_request":
            return messages[:index]
    return messages


def _asks(messages: list[BaseMessage]) -> bool:
    for message in reversed(messages):
        if message.type == "ai":
            return False
        if message.type == "human" and keeper_kind(message) is None:
            return "?" in text_of(message)
    return False


def batch(item: int, text: str, filler: int = 20) -> str:
    return f"Item {item}. {text} " + "The day went on quietly. " * filler
