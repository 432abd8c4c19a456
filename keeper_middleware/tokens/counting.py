"""Token budget: how big a request is, counting everything that is sent.

The window is a hard limit, so a count that leaves something out lets a request overflow. A common
fault is to count only message text; the system prompt, the tool schemas, the tool calls (name and
JSON arguments), the tool call ids and the reasoning text are all sent too, and are all counted here.

Three counters share one protocol:

- ``ApproximateTokenCounter`` (the default): a conservative estimate by character class that
  never undercounts a script it does not know (it may overcount). No data, no network.
- ``HuggingFaceTokenCounter``: the model's own ``tokenizer.json`` from a local folder.
- ``ServerTokenCounter``: the model server's tokenize endpoint (llama.cpp, vLLM,
  llama-cpp-python), so the count matches the server's tokenizer exactly.

The last two tokenize a text rendering of each message (role, name, content, tool calls, ids,
reasoning) and add a fixed overhead per message for the chat template's markers.

``token_counter=`` also takes what LangChain's ``trim_messages`` takes: a chat model (its
``get_num_tokens_from_messages``) or a function from messages to a count
(``count_tokens_approximately``); ``counter_adapters`` puts them behind the same protocol.
"""

from __future__ import annotations

import functools
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    Protocol,
    TypeAlias,
    runtime_checkable,
)

from langchain_core.messages import BaseMessage

from keeper_middleware.errors import (
    ArgumentTypeError,
    ConfigurationError,
)
from keeper_middleware.messages.memo import SameMessageMemo
from keeper_middleware.tokens.adapters import ChatModelTokenCounter, MessagesTokenCounter
from keeper_middleware.tokens.parts import message_parts, tools_json
from keeper_middleware.tokens.tokenizers import (
    HuggingFaceTokenCounter,
    ServerFlavor,
    ServerTokenCounter,
    TokenizeEndpointError,
)

if TYPE_CHECKING:
    from langchain_core.language_models import BaseLanguageModel

__all__ = [
    "ApproximateTokenCounter",
    "HuggingFaceTokenCounter",
    "ServerFlavor",
    "ServerTokenCounter",
    "TokenCounter",
    "TokenCounterSpec",
    "TokenizeEndpointError",
    "estimate_tokens",
    "message_parts",
    "resolve_token_counter",
]


@runtime_checkable
class TokenCounter(Protocol):
    """Counts what a request costs. ``tools`` are OpenAI-style JSON schemas
    (``langchain_core.utils.function_calling.convert_to_openai_tool`` makes them)."""

    def count_messages(
        self, messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]] = ()
    ) -> int: ...

    def count_text(self, text: str) -> int: ...


TokenCounterSpec: TypeAlias = (
    "TokenCounter | str | Callable[..., int] | BaseLanguageModel[Any] | None"
)
"""What ``token_counter=`` takes (``resolve_token_counter`` says what each means): None, a name,
a ``TokenCounter``, a LangChain chat model, or a function from messages to a count."""


_LETTERS = bytes(range(65, 91)) + bytes(range(97, 123))
_DIGITS = b"0123456789"
_BLANKS = b" \t\r\f\v"
_SYLLABLES = re.compile(rb"(?<![a-z])[A-Z]?[a-z]*[aeiouy][a-z]*(?![a-z])")
"""Pieces of ordinary words: a lowercase run (after an optional capital) with a vowel in it.
camelCase splits into them; hex, base64 and ALLCAPS mostly do not match."""
_BLANK_RUNS = re.compile(rb"[ \t\r\f\v]{2,}")


def estimate_tokens(text: str, chars_per_token: float = 4.0) -> int:
    """A count no real tokenizer should exceed, for any script (it overcounts instead).

    - every byte of a non-ASCII character is a token: byte-level BPE never makes more tokens
      than bytes, and SentencePiece falls back to bytes for what it does not know (CJK costs 3 a
      character, emoji 4; measured tokenizers use 1–3);
    - every digit, ASCII symbol and newline is a token (models split digits one by one);
    - an ordinary word piece costs ``ceil(len / chars_per_token)``; a letter outside one (hex,
      base64, ALLCAPS, consonant runs) costs a token;
    - a single space is free (it joins the next word), longer blank runs a token per 4.
    """
    data = text.encode("utf-8", "surrogatepass")
    plain = data if len(data) == len(text) else text.encode("ascii", "ignore")
    non_ascii = len(data) - len(plain)
    letters = len(plain) - len(plain.translate(None, _LETTERS))
    digits = len(plain) - len(plain.translate(None, _DIGITS))
    blanks = len(plain) - len(plain.translate(None, _BLANKS))
    newlines = plain.count(b"\n")
    symbols = len(plain) - letters - digits - blanks - newlines
    pieces = _SYLLABLES.findall(plain)
    in_pieces = sum(map(len, pieces))
    table = _ceil_table(chars_per_token)
    words = sum(
        table[n] if n < len(table) else math.ceil(n / chars_per_token) for n in map(len, pieces)
    )
    runs = sum(map(len, _BLANK_RUNS.findall(plain)))
    return non_ascii + digits + symbols + newlines + words + (letters - in_pieces) + (runs + 3) // 4


@functools.cache
def _ceil_table(chars_per_token: float) -> tuple[int, ...]:
    return tuple(math.ceil(n / chars_per_token) for n in range(256))


class _TextMemo:
    """A least-recently-used memory of one number per text, bounded in texts and in the
    characters they hold; safe to share between threads."""

    def __init__(self, size: int, chars: int) -> None:
        self.size, self.chars = size, chars
        self._held = 0
        self._known: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, text: str) -> int | None:
        # without the lock: each of these is one operation of the C ``OrderedDict`` (atomic
        # under the interpreter lock), and a text dropped in between is simply not moved
        found = self._known.get(text)
        if found is not None:
            try:
                self._known.move_to_end(text)
            except KeyError:  # dropped by another thread in between: nothing to move
                return found
        return found

    def put(self, text: str, value: int) -> None:
        if len(text) > self.chars or not self.size:
            return
        with self._lock:
            if text in self._known:
                return
            self._known[text] = value
            self._held += len(text)
            while len(self._known) > self.size or self._held > self.chars:
                old, _ = self._known.popitem(last=False)
                self._held -= len(old)


@dataclass(frozen=True, slots=True, kw_only=True)
class ApproximateTokenCounter:
    """A conservative estimate of everything sent; no tokenizer and no network needed.

    It never counts fewer tokens than a real tokenizer for a script it does not know (CJK,
    emoji, code, long digit runs; checked against all-MiniLM-L6-v2's and SmolLM2's tokenizers):
    it overcounts instead (English prose by about a quarter, CJK about twice). For exact counts
    plug the model's own tokenizer (``"hf:/path"``) or the server's (``"server:http://..."``).
    Estimates are remembered by the text itself, so a replaced message is never counted by a
    stale entry: a keeper step counts every message in view several times, and an estimate
    costs tens of microseconds even for a role name, a remembered one well under one.
    """

    chars_per_token: float = 4.0
    """Characters per token of an ordinary word piece; lower it to count more conservatively."""
    per_message: int = 4
    """Tokens the chat template adds around each message (role markers, separators)."""
    per_tool_call: int = 8
    """Tokens the template adds around each tool call."""
    per_image: int = 85
    """Fixed cost of one image (OpenAI's low-detail cost)."""
    cache_size: int = 65_536
    """How many texts' estimates are remembered (the least recently used go first)."""
    cache_chars: int = 16_000_000
    """How many characters the remembered texts may hold together (they are kept alive by the
    memory, so this bounds what it can hold on to)."""
    _memo: _TextMemo = field(init=False, repr=False, compare=False)
    _counted: SameMessageMemo[int] = field(init=False, repr=False, compare=False)
    """Each message's count, while the very same unchanged object is counted again (a session
    resends its history: every step counts the messages already in view once more)."""

    def __post_init__(self) -> None:
        if not self.chars_per_token > 0:
            raise ConfigurationError(
                f"chars_per_token={self.chars_per_token}; use a positive number such as 4.0"
            )
        for name in ("per_message", "per_tool_call", "per_image", "cache_size", "cache_chars"):
            if getattr(self, name) < 0:
                raise ConfigurationError(f"{name}={getattr(self, name)}; use 0 or more")
        object.__setattr__(self, "_memo", _TextMemo(self.cache_size, self.cache_chars))
        object.__setattr__(self, "_counted", SameMessageMemo[int]())

    def count_text(self, text: str) -> int:
        found = self._memo.get(text)
        if found is not None:
            return found
        count = estimate_tokens(text, self.chars_per_token)
        self._memo.put(text, count)
        return count

    def count_message(self, message: BaseMessage) -> int:
        found = self._counted.get(message)
        if found is not None:
            return found
        parts, images, calls = message_parts(message)
        count = (
            sum(map(self.count_text, parts))
            + self.per_message
            + self.per_tool_call * calls
            + self.per_image * images
        )
        self._counted.put(message, count)
        return count

    def count_messages(
        self, messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]] = ()
    ) -> int:
        total = sum(map(self.count_message, messages))
        return total + (self.count_text(tools_json(tools)) if tools else 0)


ADDITIVE_COUNTERS: frozenset[type] = frozenset(
    {ApproximateTokenCounter, HuggingFaceTokenCounter, ServerTokenCounter}
)
"""Counters whose count of messages is the sum of each message's count alone (plus the tools'):
a request's size can be added up from the sizes of its messages already counted."""


def resolve_token_counter(spec: TokenCounterSpec) -> TokenCounter:
    """Turn a setting into a counter.

    Args:
        spec: None or ``"approximate"`` (the default estimate), ``"hf:<path>"`` (a local
            ``tokenizer.json``), ``"server:<url>"`` (llama.cpp's tokenize endpoint), a
            ``TokenCounter`` (used as is), a LangChain chat model (its
            ``get_num_tokens_from_messages``), or a function from messages to a count such as
            ``count_tokens_approximately`` (LangChain's ``trim_messages`` takes the same two).

    Raises:
        ConfigurationError: a string that names no counter.
        ArgumentTypeError: anything else.
    """
    if spec is None or spec == "approximate":
        return ApproximateTokenCounter()
    if isinstance(spec, str):
        if spec.startswith("hf:"):
            return HuggingFaceTokenCounter(spec.removeprefix("hf:"))
        if spec.startswith("server:"):
            return ServerTokenCounter(spec.removeprefix("server:"))
        raise ConfigurationError(
            f"token_counter={spec!r} is not known; use 'approximate', 'hf:/path/to/model', "
            "'server:http://host:port' (llama.cpp), or a TokenCounter such as "
            "ServerTokenCounter(url, flavor='vllm')"
        )
    if isinstance(spec, TokenCounter):
        return spec
    if callable(getattr(spec, "get_num_tokens_from_messages", None)):
        return ChatModelTokenCounter(spec)
    if callable(spec):
        return MessagesTokenCounter(spec)
    raise ArgumentTypeError(
        f"token_counter={spec!r} is a {type(spec).__name__}; give a name such as 'approximate', "
        "a TokenCounter, a chat model, or a function from messages to a count such as "
        "langchain_core.messages.utils.count_tokens_approximately"
    )
