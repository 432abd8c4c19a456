"""The pinned state a self-editing model keeps at the top of its window, and its edit tools.

This is the method Letta (MemGPT) gives an agent as core memory: a block pinned in context that
only the model edits, through tools, within a size limit. Three styles, one per arm family:

- ``lines``: ``name value`` lines; ``memory_set(name, value)`` adds or replaces one (and moves it
  to the end: the first lines are those set least recently), ``memory_delete(name)`` removes one;
- ``rules``: the same, plus permanent ``RULE:`` lines added with ``memory_rule(rule)``. An edit
  that would remove or reword a rule line is rejected, and says so;
- ``prose``: free-text notes; ``notes_append(text)`` adds a line, ``notes_replace(old, new)``
  changes a passage (Letta's ``core_memory_append`` / ``core_memory_replace``). Nothing is
  protected: prose the model wrote can be replaced like any other.

Every edit is a pure function of the state and the model's raw arguments: bad arguments and
edits over the size limit come back as a ``Refused: …`` text that says what to send instead, and
leave the state as it was (Letta answers an edit over its block limit the same way).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from keeper_middleware.errors import ConfigurationError

Style = Literal["lines", "rules", "prose"]
STYLES: tuple[Style, ...] = ("lines", "rules", "prose")

PINNED_TAG = "[PINNED STATE]"
RULE_PREFIX = "RULE:"
READ_UP_TO = "Read up to item {item}."
USED = "{used} of {budget} tokens used."
MAX_NAME_CHARS = 80
MAX_VALUE_CHARS = 400
MAX_TEXT_CHARS = 2_000

SET_TOOL = "memory_set"
DELETE_TOOL = "memory_delete"
RULE_TOOL = "memory_rule"
APPEND_TOOL = "notes_append"
REPLACE_TOOL = "notes_replace"
TOOLS_OF_STYLE: dict[Style, tuple[str, ...]] = {
    "lines": (SET_TOOL, DELETE_TOOL),
    "rules": (SET_TOOL, DELETE_TOOL, RULE_TOOL),
    "prose": (APPEND_TOOL, REPLACE_TOOL),
}
MEMORY_TOOLS = frozenset(name for names in TOOLS_OF_STYLE.values() for name in names)

_STRING = {"type": "string"}
TOOL_SCHEMAS: dict[str, dict[str, Any]] = {
    SET_TOOL: {
        "name": SET_TOOL,
        "description": "Set a `name value` line of your pinned state (a new value replaces the "
        "old one).",
        "parameters": {
            "type": "object",
            "properties": {
                "name": {**_STRING, "description": "The line's name, e.g. a counter's name."},
                "value": {**_STRING, "description": "Its value now."},
            },
            "required": ["name", "value"],
        },
    },
    DELETE_TOOL: {
        "name": DELETE_TOOL,
        "description": "Remove the line with this name from your pinned state.",
        "parameters": {
            "type": "object",
            "properties": {"name": {**_STRING, "description": "The line's name."}},
            "required": ["name"],
        },
    },
    RULE_TOOL: {
        "name": RULE_TOOL,
        "description": "Add a permanent RULE: line to your pinned state, word for word as the "
        "rule or method was stated. Rule lines cannot be changed or removed.",
        "parameters": {
            "type": "object",
            "properties": {"rule": {**_STRING, "description": "The rule, word for word."}},
            "required": ["rule"],
        },
    },
    APPEND_TOOL: {
        "name": APPEND_TOOL,
        "description": "Add text to your notes (a new line at the end).",
        "parameters": {
            "type": "object",
            "properties": {"text": {**_STRING, "description": "The text to add."}},
            "required": ["text"],
        },
    },
    REPLACE_TOOL: {
        "name": REPLACE_TOOL,
        "description": "Replace a passage of your notes, copied exactly, with new text (an "
        "empty new text removes it).",
        "parameters": {
            "type": "object",
            "properties": {
                "old": {**_STRING, "description": "The passage as it stands in the notes."},
                "new": {**_STRING, "description": "What replaces it ('' to remove it)."},
            },
            "required": ["old", "new"],
        },
    },
}
"""Each tool as an OpenAI-style function schema (how the model is shown it)."""

_READ = (
    "After reading each batch, write down what it changed before you go on. Batches you have "
    "processed leave the window"
)
_ARCHIVE = "; they go word for word to a read-only archive, and search_archive(query) recalls them"
INSTRUCTIONS: dict[tuple[Style, bool], str] = {
    ("lines", False): (
        f"{_READ}; only these lines stay. Keep one `name value` line per counter with its "
        "value now: memory_set(name, value) sets one, memory_delete(name) removes one."
    ),
    ("lines", True): (
        f"{_READ}{_ARCHIVE}. Keep one `name value` line per counter with its value now: "
        "memory_set(name, value) sets one, memory_delete(name) removes one."
    ),
    ("rules", True): (
        f"{_READ}{_ARCHIVE}. Keep one `name value` line per counter with its value now: "
        "memory_set(name, value) sets one, memory_delete(name) removes one. When a rule or "
        "method is stated, write it down word for word with memory_rule(rule): RULE: lines are "
        "permanent. Read the RULE: lines before answering."
    ),
    ("prose", True): (
        f"{_READ}{_ARCHIVE}. Keep your notes in free text: notes_append(text) adds to them, "
        "notes_replace(old, new) changes a passage (copy it exactly; an empty new removes it)."
    ),
}
RULES_READ_SENTENCE = "Read the RULE: lines before answering."
"""The rules arm's instruction to consult its rule lines at the point of use."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PinnedState:
    """The model's own memory: what it wrote, in the order it wrote it. A value, not a store."""

    style: Style
    rules: tuple[str, ...] = ()
    """Permanent ``RULE:`` lines (``rules`` style only)."""
    lines: tuple[tuple[str, str], ...] = ()
    """``name value`` lines, the one set least recently first (``lines`` and ``rules``)."""
    prose: tuple[str, ...] = ()
    """Free-text lines, oldest first (``prose``)."""
    through_item: int = 0
    """The last item whose batch has been processed and has left the window."""

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise ConfigurationError(f"style={self.style!r}; use one of {', '.join(STYLES)}")

    def body(self) -> str:
        """The lines the model wrote, as it sees them."""
        rows = [f"{RULE_PREFIX} {rule}" for rule in self.rules]
        rows += [f"{name} {value}" for name, value in self.lines]
        rows += list(self.prose)
        return "\n".join(rows)

    def value_of(self, name: str) -> str | None:
        return next((value for key, value in self.lines if key == name), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "style": self.style,
            "rules": list(self.rules),
            "lines": [list(line) for line in self.lines],
            "prose": list(self.prose),
            "through_item": self.through_item,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], style: Style) -> PinnedState:
        if not data:
            return cls(style=style)
        return cls(
            style=style,
            rules=tuple(str(rule) for rule in data.get("rules", ())),
            lines=tuple((str(k), str(v)) for k, v in data.get("lines", ())),
            prose=tuple(str(line) for line in data.get("prose", ())),
            through_item=int(data.get("through_item", 0)),
        )


def render_pinned(
    state: PinnedState, *, archive: bool, budget: int, count: Callable[[str], int]
) -> str:
    """The pinned message: the tag, the instructions, where reading stands, then the body."""
    instructions = INSTRUCTIONS[(state.style, archive)]
    body = state.body()
    where = READ_UP_TO.format(item=state.through_item)
    used = USED.format(used=count(body) if body else 0, budget=budget)
    head = f"{PINNED_TAG} Your own memory, always at the top of the window. {instructions}"
    return f"{head}\n{where} {used}\n\n{body}".rstrip()


# ---------------------------------------------------------------------------------------------
# Edits (pure): the state after one tool call, and the tool's reply
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class EditResult:
    state: PinnedState
    reply: str
    accepted: bool


def _refused(state: PinnedState, reason: str) -> EditResult:
    return EditResult(state, f"Refused: {reason}", False)


class _Problem(str):
    """Why an argument cannot be used (the text after "Refused: ")."""


def _text(value: object, field: str, limit: int, *, multiline: bool = False) -> str:
    """The argument as clean text, or a ``_Problem`` saying what to send instead."""
    if not isinstance(value, str):
        return _Problem(f"{field} must be text, not {type(value).__name__}.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return _Problem(f"the {field} holds characters that are not text (a lone surrogate).")
    if multiline:
        text = "\n".join(" ".join(line.split()) for line in value.splitlines() if line.strip())
    else:
        text = " ".join(value.split())
    if not text:
        return _Problem(f"give a {field} (it is empty).")
    if len(text) > limit:
        return _Problem(f"the {field} is {len(text)} characters; keep it within {limit}.")
    return text


def _is_rule_name(name: str) -> bool:
    return name.rstrip(":").strip().upper() == "RULE" or name.upper().startswith(RULE_PREFIX)


def apply_edit(
    state: PinnedState,
    tool: str,
    args: object,
    *,
    budget: int,
    count: Callable[[str], int],
) -> EditResult:
    """One memory tool call applied to ``state`` (never raises for anything a model can send)."""
    if tool not in TOOLS_OF_STYLE[state.style]:
        allowed = ", ".join(TOOLS_OF_STYLE[state.style])
        return _refused(state, f"{tool} is not one of your memory tools ({allowed}).")
    if not isinstance(args, Mapping):
        return _refused(state, "the arguments must be an object of named fields.")
    edited = _edited(state, tool, args)
    if isinstance(edited, _Problem):
        return _refused(state, edited)
    new, done = edited
    size = count(new.body())
    if size > budget and size > count(state.body()):
        return _refused(
            state,
            f"the pinned state would hold {size} tokens, over its {budget}. Remove what you no "
            "longer need first"
            + (" (memory_delete)" if state.style != "prose" else " (notes_replace with new='')")
            + ", then send this again.",
        )
    return EditResult(new, done, True)


def _edited(
    state: PinnedState, tool: str, args: Mapping[str, Any]
) -> tuple[PinnedState, str] | _Problem:
    if tool == SET_TOOL:
        name = _text(args.get("name"), "name", MAX_NAME_CHARS)
        value = _text(args.get("value"), "value", MAX_VALUE_CHARS)
        for checked in (name, value):
            if isinstance(checked, _Problem):
                return checked
        if " " in name:
            return _Problem(f"a name is one word (got {name[:40]!r}); put the rest in the value.")
        if state.style == "rules" and _is_rule_name(name):
            return _Problem(
                "RULE: lines are permanent: they cannot be changed or removed. Add a new rule "
                "with memory_rule(rule)."
            )
        kept = tuple(line for line in state.lines if line[0] != name)
        return replace(state, lines=(*kept, (name, value))), "Done."
    if tool == DELETE_TOOL:
        name = _text(args.get("name"), "name", MAX_NAME_CHARS)
        if isinstance(name, _Problem):
            return name
        if state.style == "rules" and (
            _is_rule_name(name) or any(name in rule for rule in state.rules)
        ):
            return _Problem("RULE: lines are permanent: they cannot be changed or removed.")
        if state.value_of(name) is None:
            return _Problem(f"no line is named {name[:40]!r}; nothing was removed.")
        return replace(state, lines=tuple(line for line in state.lines if line[0] != name)), "Done."
    if tool == RULE_TOOL:
        rule = _text(args.get("rule"), "rule", MAX_VALUE_CHARS)
        if isinstance(rule, _Problem):
            return rule
        if rule.upper().startswith(RULE_PREFIX):
            rule = rule[len(RULE_PREFIX) :].strip() or rule
        if rule in state.rules:
            return state, "Already kept."
        return replace(state, rules=(*state.rules, rule)), "Done."
    if tool == APPEND_TOOL:
        text = _text(args.get("text"), "text", MAX_TEXT_CHARS, multiline=True)
        if isinstance(text, _Problem):
            return text
        return replace(state, prose=(*state.prose, *text.splitlines())), "Done."
    old = _text(args.get("old"), "old passage", MAX_TEXT_CHARS, multiline=True)
    if isinstance(old, _Problem):
        return old
    given_new = args.get("new")
    new = (
        ""
        if given_new in (None, "")
        else _text(given_new, "new text", MAX_TEXT_CHARS, multiline=True)
    )
    if isinstance(new, _Problem):
        return new
    notes = "\n".join(state.prose)
    if old not in notes:
        return _Problem("that passage is not in the notes; copy it exactly as it stands.")
    changed = notes.replace(old, new, 1)
    lines = (" ".join(line.split()) for line in changed.splitlines())
    return replace(state, prose=tuple(line for line in lines if line)), "Done."
