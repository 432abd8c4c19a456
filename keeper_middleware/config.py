"""How the keeper is configured: one frozen, keyword-only dataclass.

Sizes accept LangChain's tuple dialect (``("tokens", 32_000)``, ``("fraction", 0.8)``) so users of
its middleware need not learn a second one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from keeper_middleware.errors import ConfigurationError

NotesMode = Literal["in_place", "rewrite"]
Size = int | tuple[str, float]


def _frozen(mapping: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True, slots=True, kw_only=True)
class ThinkingPolicy:
    """What the keeper forwards to the model about thinking.

    Thinking stays on while a question is open and for note-taking (notes written without thinking
    looked fine and held wrong values); it may be off for ordinary reading. The kwargs are passed to
    the chat model call as they are (for ``ChatOpenAI`` against vLLM, for example
    ``{"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}``).
    """

    on: Mapping[str, Any] = field(default_factory=dict)
    """Call kwargs that turn thinking on (used while a question is open and for notes)."""
    off: Mapping[str, Any] = field(default_factory=dict)
    """Call kwargs that turn thinking off (ordinary turns, and the retry of a reply that thought
    to its limit and wrote nothing)."""
    reasoning_effort: str | None = None
    """Forwarded on every call as ``reasoning_effort`` when set ("medium" halved a measured run)."""
    retry_empty_without_thinking: bool = True
    """Ask again, thinking off, when a reply has no content and stopped at its token limit."""
    retry_empty: bool = True
    """Ask once more, with some randomness, when a reply has neither text nor a tool call."""
    sample_after_stop: Mapping[str, Any] = field(default_factory=lambda: {"temperature": 0.7})
    """Call kwargs for the one reply after the model is told to stop searching, so it can come out
    different from the loop it was in."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "on", _frozen(self.on))
        object.__setattr__(self, "off", _frozen(self.off))
        object.__setattr__(self, "sample_after_stop", _frozen(self.sample_after_stop))


@dataclass(frozen=True, slots=True, kw_only=True)
class KeeperConfig:
    """Everything the keeper decides by. Defaults follow the measured settings."""

    window: int = 32_768
    """The live window in tokens: no request the keeper sends or lets through is larger."""
    reply_reserve: int = 4_096
    """Tokens kept free for the model's reply (and its thinking)."""
    notes_at: Size = ("fraction", 0.8)
    """Take notes when a request reaches this size (tokens, or a fraction of window - reserve)."""
    notes_every_items: int | None = 10
    """Also take notes every N new items (10 measured as well as 6, at less cost); None: only by size."""
    notes_mode: NotesMode = "in_place"
    """``in_place`` (write only the changes, checked) or ``rewrite`` (the earlier full rewrite)."""
    max_reasks: int = 2
    """How often a note reply that fails a check is asked for again."""
    tracked_names: str | None = None
    """A regex for the names whose mentions the domain checks account for (counters, files,
    tickets). None turns the domain checks off; the generic checks are always on."""
    pinned_head: int = 1
    """How many leading user messages (the task) stay in view for ever."""
    item_pattern: str | None = r"^\s*(?:Item|Batch|Ticket)\s+#?(\d+)\b"
    """How a new input names its own number; an input that does not match gets the next number."""
    item_tools: tuple[str, ...] = ()
    """Tools whose results are new inputs (e.g. ``read_next_batch``), numbered like user messages."""
    question_patterns: tuple[str, ...] = (r"\?\s*$", r"^\s*(?:Final )?[Qq]uestions\b")
    """Regexes (multiline) that make a user message a question or instruction set."""
    rules_next_to_questions: bool = True
    """Repeat the RULES right after each new question set (22/29 pinned only, 29/29 repeated)."""
    show_retrieved: int = 0
    """Also show this many best-matching archived sentences next to each new question set."""
    search_results: int = 10
    """How many matches the archive search shows at most."""
    search_scan: int = 200
    """How many matches the search looks at to report how many there are."""
    thinking: ThinkingPolicy = field(default_factory=ThinkingPolicy)

    def __post_init__(self) -> None:
        if self.window < 1024:
            raise ConfigurationError(f"window={self.window} is too small; use at least 1024 tokens")
        if not 0 <= self.reply_reserve < self.window // 2:
            raise ConfigurationError(
                f"reply_reserve={self.reply_reserve} must be between 0 and half the window "
                f"({self.window // 2})"
            )
        if self.notes_mode not in ("in_place", "rewrite"):
            raise ConfigurationError(
                f"notes_mode={self.notes_mode!r}; use 'in_place' (default) or 'rewrite'"
            )
        if self.notes_every_items is not None and self.notes_every_items < 1:
            raise ConfigurationError("notes_every_items must be a positive number of items or None")
        if self.max_reasks < 0:
            raise ConfigurationError("max_reasks must be 0 or more")
        if self.pinned_head < 0:
            raise ConfigurationError("pinned_head must be 0 or more")
        if self.search_results < 1 or self.search_scan < self.search_results:
            raise ConfigurationError("need 1 <= search_results <= search_scan")
        budget = self.notes_threshold  # validates notes_at
        if budget <= 0:
            raise ConfigurationError("notes_at leaves no room; raise it or the window")
        object.__setattr__(self, "item_tools", tuple(self.item_tools))
        object.__setattr__(self, "question_patterns", tuple(self.question_patterns))

    @property
    def budget(self) -> int:
        """The largest request the keeper lets through."""
        return self.window - self.reply_reserve

    @property
    def notes_threshold(self) -> int:
        """Request size (tokens) at which notes are taken."""
        return resolve_size(self.notes_at, self.budget, name="notes_at")


def resolve_size(size: Size, whole: int, *, name: str) -> int:
    """Turn ``1234``, ``("tokens", 1234)`` or ``("fraction", 0.8)`` into tokens."""
    if isinstance(size, int) and not isinstance(size, bool):
        value = size
    elif isinstance(size, tuple) and len(size) == 2 and size[0] in ("tokens", "fraction"):
        kind, amount = size
        if kind == "fraction":
            if not 0 < amount <= 1:
                raise ConfigurationError(f"{name}=('fraction', {amount}) must be in (0, 1]")
            value = int(whole * amount)
        else:
            value = int(amount)
    else:
        raise ConfigurationError(
            f"{name}={size!r}; use a token count, ('tokens', N) or ('fraction', f)"
        )
    if value > whole:
        raise ConfigurationError(f"{name} is {value} tokens, more than the budget of {whole}")
    return value
