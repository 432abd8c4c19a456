"""How the keeper is configured: one frozen, keyword-only dataclass.

Sizes accept LangChain's tuple dialect (``("tokens", 32_000)``, ``("fraction", 0.8)``) so users of
its middleware need not learn a second one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from keeper_middleware.errors import ConfigurationError
from keeper_middleware.retrievers.passages import PASSAGE_UNITS
from keeper_middleware.step.items import numeric_group_problem

NotesMode = Literal["in_place", "rewrite"]
StateMessages = Literal["window", "all", "window_with_keeper"]
STATE_MESSAGES: tuple[StateMessages, ...] = ("window", "all", "window_with_keeper")
Size = int | tuple[str, float]
DEFAULT_NOTES_FRACTION = 0.10
"""The NOTES' default share of window - reserve (see `KeeperConfig.notes_budget`)."""


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
    """Everything the keeper decides by. Defaults follow the measured settings.

    Each field is documented where it is declared below.

    Raises:
        ConfigurationError: a field is out of range or of a kind the keeper cannot use (a
            window under 1,024 tokens, a pattern that does not compile, ...); the message
            names the field and the fix.
    """

    window: int = 32_768
    """The live window in tokens: no request the keeper sends or lets through is larger."""
    reply_reserve: int | None = None
    """Tokens kept free for the model's reply (and its thinking). None (the default) scales with
    the window: 4,096 tokens, or an eighth of a window under 32K (see :attr:`reserve`)."""
    notes_at: Size = ("fraction", 0.8)
    """Take notes when a request reaches this size (tokens, or a fraction of window - reserve)."""
    notes_every_items: int | None = 10
    """Also take notes every N new items (10 measured as well as 6, at less cost); None: only by size.
    The NOTES count toward the N as the items their size is worth, so calls keep their size as the
    NOTES fill (never fewer than N/2 items; `keeper_middleware.notes.cadence`)."""
    notes_mode: NotesMode = "in_place"
    """``in_place`` (write only the changes, checked) or ``rewrite`` (the earlier full rewrite)."""
    max_reasks: int = 2
    """How often a note reply that fails a check is asked for again."""
    notes_budget: Size | None = None
    """The most tokens the NOTES may take (tokens, or a fraction of window - reserve). Over it,
    the STATE entries set least recently move to the archive, word for word and searchable, so
    the NOTES (and the cost of every call) stop growing with the conversation. None: 10% of
    window - reserve (2,867 tokens at a 32K window, several hundred entries), at least 512 and at
    most a quarter of ``notes_at``: every call carries the NOTES, so their size sets how much a
    long conversation's calls cost, while a budget too small for the values a task keeps live
    sends them to the archive and costs answers (at 3.5% a small stream lost answers at 4K)."""
    max_rules: int = 24
    """The most RULES lines the NOTES hold; a rule past the cap is left out (rules are never
    removed, so the cap is what keeps them from crowding out everything else)."""
    tracked_names: str | None = None
    """A regex for the names whose mentions the domain checks account for (counters, files,
    tickets). None turns the domain checks off; the generic checks are always on."""
    track_noted_names: bool = False
    """With no ``tracked_names``, account for the names the NOTES already hold: a noted turn that
    names a one-word STATE key with an amount, and no line for it, is asked about again (nothing
    is left out). A pattern from the conversation itself, for agents whose names have none."""
    pinned_head: int = 1
    """How many leading user messages (the task) stay in view for ever."""
    item_pattern: str | None = r"^\s*(?:Item|Batch|Ticket)\s+#?(\d+)\b"
    """How a new input names its own number; an input that does not match gets the next number.
    None: no input states a number (and none is learned, ``learn_item_heads``)."""
    learn_item_heads: bool = True
    """While ``item_pattern`` has matched no input of a session, learn the head its inputs use:
    two content inputs in a row that open with the same word and a number one higher ("Entry 4.",
    "Entry 5.") make that word the head, and the inputs count in its numbers from then on. Search
    and NOTES count in the content's own numbers; numbered by the keeper, a question set was an
    item of its own and the numbers drifted from the content's by one per set."""
    item_tools: tuple[str, ...] = ()
    """Tools whose results are new inputs (e.g. ``read_next_batch``), numbered like user messages."""
    question_patterns: tuple[str, ...] = (r"\?\s*$", r"^\s*(?:Final )?[Qq]uestions\b")
    """Regexes (multiline) that make a user message a question or instruction set."""
    rules_next_to_questions: bool = True
    """Repeat the RULES right after each new question set (22/29 pinned only, 29/29 repeated)."""
    show_retrieved: int = 0
    """Also show this many best-matching archived sentences next to each new question set."""
    passages: str = "messages"
    """What the archive indexes as one passage: ``messages`` (each message cut into bounded
    chunks of whole sentences; the embedding backend also gives each sentence a vector), or
    ``sentences``. Every passage carries its message's context (who, when, which item).
    Messages find the evidence more often on real conversation (LoCoMo, every backend;
    bench/results/locomo_recall.md). A hit on a message shows the matched sentence marked."""
    keyword_engine: str = "auto"
    """What ranks the keyword search of an archive's index folder: ``fts5`` (SQLite, no
    dependency), ``tantivy`` (the ``tantivy`` extra; keeps a search in milliseconds at millions
    of passages), or ``auto``: FTS5 until its file outgrows a small archive, then tantivy
    (built again from the archive once). PostgreSQL archives search on the server either way."""
    search_results: int = 10
    """How many matches the archive search shows at most."""
    search_scan: int = 200
    """Up to how many matches the search counts to report how many there are (the shown ones
    are ranked as a search for ``search_results`` hits ranks them)."""
    search_budget: int | None = 10
    """How many searches may run between two new inputs; after that each search is refused and
    the model told to answer (a model that searches with a new query every time is caught by no
    repeat guard). None: no budget."""
    searches_per_question: int = 2
    """A question set's turn may run this many searches per question it asks, when that is more
    than ``search_budget`` (its questions are its lines that end in "?"). 0: ``search_budget``
    for every turn."""
    message_limit: Size = ("fraction", 0.25)
    """The most one message may take in view (tokens, or a fraction of window - reserve). A bigger
    message, or one too big for the room left beside the fixed part, is archived word for word
    and stands in view as an excerpt (head and tail) with a pointer to read it page by page."""
    thinking: ThinkingPolicy = field(default_factory=ThinkingPolicy)
    """When the model thinks, and when a reply is asked again (``ThinkingPolicy``)."""
    state_messages: StateMessages | None = None
    """What a graph's ``state["messages"]`` holds (docs/state-messages.md): ``"window"`` the
    window without the keeper's own messages (the NOTES, RULES and passages are added to what
    the model is sent, from the keeper's state channel, so a chat UI never streams them),
    ``"all"`` every message (the keeper shapes only the model's input), ``"window_with_keeper"``
    the window with the keeper's messages in it, marked (the behaviour before the other two).
    None: ``"window"`` wherever the keeper composes the model's input (``create_keeper_agent``,
    ``KeeperMiddleware``, the pre-model hook), ``"window_with_keeper"`` for a ``KeeperNode``
    before a model node of your own, which reads ``state["messages"]``."""

    _sizes: tuple[int, int, int, int, int] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    """(reserve, budget, message_tokens, notes_tokens, notes_threshold), worked out once the
    fields are checked: a step reads them dozens of times, and they never change."""

    def __post_init__(self) -> None:
        _check_int("window", self.window, minimum=1024, fix="tokens")
        if self.reply_reserve is not None:
            _check_int("reply_reserve", self.reply_reserve, minimum=0, fix="(or leave it unset)")
            if self.reply_reserve >= self.window // 2:
                raise ConfigurationError(
                    f"reply_reserve={self.reply_reserve} leaves too little of window={self.window}:"
                    f" use at most {self.window // 2 - 1} (under half the window), or leave it "
                    "unset to scale with the window"
                )
        if self.state_messages is not None and self.state_messages not in STATE_MESSAGES:
            raise ConfigurationError(
                f"state_messages={self.state_messages!r}; use one of {', '.join(STATE_MESSAGES)}"
                " (or None for the entry point's default)"
            )
        if self.notes_mode not in ("in_place", "rewrite"):
            raise ConfigurationError(
                f"notes_mode={self.notes_mode!r}; use 'in_place' (default) or 'rewrite'"
            )
        if self.notes_every_items is not None:
            _check_int("notes_every_items", self.notes_every_items, minimum=1, fix="(or None)")
        _check_int("max_reasks", self.max_reasks, minimum=0)
        _check_int("pinned_head", self.pinned_head, minimum=0)
        _check_int("show_retrieved", self.show_retrieved, minimum=0, fix="(0 turns it off)")
        if self.passages not in PASSAGE_UNITS:
            raise ConfigurationError(
                f"passages={self.passages!r}; use one of {', '.join(PASSAGE_UNITS)}"
            )
        if self.keyword_engine not in ("auto", "fts5", "tantivy"):
            raise ConfigurationError(
                f"keyword_engine={self.keyword_engine!r}; use 'auto', 'fts5' or 'tantivy'"
            )
        _check_int("search_results", self.search_results, minimum=1)
        _check_int("search_scan", self.search_scan, minimum=1)
        if self.search_scan < self.search_results:
            raise ConfigurationError(
                f"search_scan={self.search_scan} is below search_results={self.search_results}; "
                "need 1 <= search_results <= search_scan"
            )
        for name in ("item_tools", "question_patterns"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise ConfigurationError(
                    f"{name}={value!r}; give a tuple of strings, e.g. ({value!r},)"
                    if isinstance(value, str)
                    else f"{name}={value!r}; give a tuple of strings"
                )
        if self.item_pattern is not None:
            pattern = _check_regex("item_pattern", self.item_pattern)
            if pattern.groups < 1:
                raise ConfigurationError(
                    f"item_pattern={self.item_pattern!r} has no capture group; capture the item "
                    r"number, e.g. r'^Item (\d+)', or set item_pattern=None"
                )
            problem = numeric_group_problem(pattern)
            if problem is not None:
                raise ConfigurationError(
                    f"item_pattern={self.item_pattern!r}: {problem}, and an item number is a "
                    r"whole number; capture digits only, e.g. r'^Item (\d+)', or set "
                    "item_pattern=None"
                )
        for question in self.question_patterns:
            _check_regex("question_patterns", question)
        if self.tracked_names is not None:
            _check_regex("tracked_names", self.tracked_names)
        if not isinstance(self.thinking, ThinkingPolicy):
            raise ConfigurationError(
                f"thinking={self.thinking!r}; give a ThinkingPolicy(on=..., off=...)"
            )
        _check_int("searches_per_question", self.searches_per_question, minimum=0, fix="(0: off)")
        if self.search_budget is not None:
            _check_int("search_budget", self.search_budget, minimum=1, fix="(or None)")
        if self.message_tokens < 128:
            raise ConfigurationError(
                f"message_limit={self.message_limit!r} allows {self.message_tokens} tokens a "
                "message; allow at least 128 (raise it or the window)"
            )
        budget = self.notes_threshold  # validates notes_at
        if budget <= 0:
            raise ConfigurationError("notes_at leaves no room; raise it or the window")
        if self.notes_tokens < 64:
            raise ConfigurationError(
                f"notes_budget={self.notes_budget!r} is {self.notes_tokens} tokens; give the "
                "NOTES at least 64 tokens (e.g. ('fraction', 0.08))"
            )
        if self.notes_tokens > self.notes_threshold // 2:
            raise ConfigurationError(
                f"notes_budget={self.notes_budget!r} is {self.notes_tokens} tokens, more than "
                f"half of notes_at ({self.notes_threshold}): the NOTES would leave the turns no "
                "room; lower notes_budget or raise the window"
            )
        if self.max_rules < 0:
            raise ConfigurationError("max_rules must be 0 or more (0: the NOTES keep no rules)")
        object.__setattr__(self, "item_tools", tuple(self.item_tools))
        object.__setattr__(self, "question_patterns", tuple(self.question_patterns))
        sizes = (
            self.reserve,
            self.budget,
            self.message_tokens,
            self.notes_tokens,
            self.notes_threshold,
        )
        object.__setattr__(self, "_sizes", sizes)

    @property
    def reserve(self) -> int:
        """The reply reserve in tokens: ``reply_reserve``, or the one scaled to the window."""
        if self._sizes is not None:
            return self._sizes[0]
        if self.reply_reserve is not None:
            return self.reply_reserve
        return scaled_reply_reserve(self.window)

    @property
    def budget(self) -> int:
        """The largest request the keeper lets through."""
        if self._sizes is not None:
            return self._sizes[1]
        return self.window - self.reserve

    @property
    def message_tokens(self) -> int:
        """The most one message may take in view, in tokens (``message_limit`` resolved)."""
        if self._sizes is not None:
            return self._sizes[2]
        return resolve_size(self.message_limit, self.budget, name="message_limit")

    @property
    def page_tokens(self) -> int:
        """The size of one page when an archived message is read back."""
        return self.message_tokens // 2

    @property
    def notes_tokens(self) -> int:
        """The NOTES budget in tokens."""
        if self._sizes is not None:
            return self._sizes[3]
        if self.notes_budget is None:
            default = max(512, int(self.budget * DEFAULT_NOTES_FRACTION))
            return min(default, self.notes_threshold // 4)
        return resolve_size(self.notes_budget, self.budget, name="notes_budget")

    @property
    def notes_threshold(self) -> int:
        """Request size (tokens) at which notes are taken."""
        if self._sizes is not None:
            return self._sizes[4]
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


def scaled_reply_reserve(window: int) -> int:
    """The default reply reserve: 4,096 tokens, or an eighth of a smaller window (a 4K window
    keeps 512), so every window from 1K to 1M works with the defaults."""
    return min(4096, window // 8)


def _check_int(name: str, value: object, *, minimum: int, fix: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(
            f"{name}={value!r} is a {type(value).__name__}; give a whole number of at least "
            f"{minimum}, e.g. {name}={_example(value, minimum)}"
        )
    if value < minimum:
        more = f" {fix}" if fix else ""
        raise ConfigurationError(f"{name}={value} is too small; use at least {minimum}{more}")


def _example(value: object, minimum: int) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return max(minimum, 1)


def _check_regex(name: str, pattern: object) -> re.Pattern[str]:
    if not isinstance(pattern, str):
        raise ConfigurationError(f"{name}={pattern!r}; give a regular expression as a string")
    try:
        return re.compile(pattern, re.MULTILINE)
    except re.error as exc:
        raise ConfigurationError(
            f"{name}={pattern!r} is not a valid regular expression ({exc}); fix the pattern"
        ) from exc
