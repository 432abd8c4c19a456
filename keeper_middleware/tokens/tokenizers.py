"""Counters that tokenize with the model's own tokenizer: a local ``tokenizer.json``
(:class:`HuggingFaceTokenCounter`) or the model server's tokenize endpoint
(:class:`ServerTokenCounter`, for llama.cpp, vLLM and llama-cpp-python).

Both tokenize a text rendering of each message (:func:`~keeper_middleware.tokens.parts.message_parts`)
and add a fixed overhead per message for the chat template's markers; counts are remembered by a
digest of the text, so the memory stays small however long the messages are.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self, get_args

from langchain_core.messages import BaseMessage

from keeper_middleware.errors import (
    ConfigurationError,
    KeeperError,
    MissingDependencyError,
)
from keeper_middleware.messages.memo import SameMessageMemo
from keeper_middleware.tokens.parts import message_parts, tools_json

if TYPE_CHECKING:
    import httpx

__all__ = ["HuggingFaceTokenCounter", "ServerFlavor", "ServerTokenCounter", "TokenizeEndpointError"]

ServerFlavor = Literal["llama.cpp", "vllm", "llama-cpp-python"]
_ENDPOINTS: dict[str, str] = {
    "llama.cpp": "/tokenize",
    "vllm": "/tokenize",
    "llama-cpp-python": "/extras/tokenize/count",
}


class TokenizeEndpointError(KeeperError):
    """The server's tokenize endpoint could not be reached or gave an answer it should not."""


class _TextCountingCounter:
    """Counts messages by tokenizing their rendering; remembers counts by a digest of the text.

    The memory holds digests, not texts, so it stays small however long the messages are.
    """

    def __init__(self, *, per_message: int, per_image: int, cache_size: int) -> None:
        if per_message < 0 or per_image < 0 or cache_size < 0:
            raise ConfigurationError("per_message, per_image and cache_size must be 0 or more")
        self.per_message = per_message
        self.per_image = per_image
        self._cache_size = cache_size
        self._cache: OrderedDict[bytes, int] = OrderedDict()
        self._lock = threading.Lock()
        self._counted = SameMessageMemo[int]()

    def _tokenize_count(self, text: str) -> int:
        raise NotImplementedError

    def count_text(self, text: str) -> int:
        if not text:
            return 0
        key = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        count = self._tokenize_count(text)
        with self._lock:
            self._cache[key] = count
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return count

    def count_messages(
        self, messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]] = ()
    ) -> int:
        total = 0
        for message in messages:
            count = self._counted.get(message)
            if count is None:
                parts, images, _ = message_parts(message)
                count = self.count_text("\n".join(parts)) + self.per_message
                count += self.per_image * images
                self._counted.put(message, count)
            total += count
        return total + (self.count_text(tools_json(tools)) if tools else 0)


class HuggingFaceTokenCounter(_TextCountingCounter):
    """The model's own tokenizer, loaded from a local ``tokenizer.json`` (no network)."""

    def __init__(
        self,
        path: str | Path,
        *,
        per_message: int = 4,
        per_image: int = 85,
        cache_size: int = 4096,
    ) -> None:
        super().__init__(per_message=per_message, per_image=per_image, cache_size=cache_size)
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise MissingDependencyError("tokenizers", "embeddings") from exc
        file = Path(path)
        if file.is_dir():
            file = file / "tokenizer.json"
        if not file.is_file():
            raise ConfigurationError(
                f"no tokenizer file at {file}; pass a model folder holding tokenizer.json, "
                "or the path of the file itself"
            )
        self.path = file
        self._tokenizer = Tokenizer.from_file(str(file))
        # a tokenizer.json may pad or truncate every encoding (MiniLM's pads to 128)
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()

    def _tokenize_count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def __repr__(self) -> str:
        return f"HuggingFaceTokenCounter({str(self.path)!r})"


class ServerTokenCounter(_TextCountingCounter):
    """The model server's own count, from its tokenize endpoint.

    ``base_url`` is the server's address; a trailing ``/v1`` (as given to OpenAI clients) is
    dropped, since the tokenize endpoints sit at the root.
    """

    def __init__(
        self,
        base_url: str,
        *,
        flavor: ServerFlavor = "llama.cpp",
        model: str | None = None,
        timeout: float = 10.0,
        per_message: int = 4,
        per_image: int = 85,
        cache_size: int = 4096,
    ) -> None:
        super().__init__(per_message=per_message, per_image=per_image, cache_size=cache_size)
        if flavor not in _ENDPOINTS:
            raise ConfigurationError(
                f"flavor={flavor!r}; use one of {', '.join(map(repr, get_args(ServerFlavor)))}"
            )
        if not base_url.startswith(("http://", "https://")):
            raise ConfigurationError(f"base_url={base_url!r}; use e.g. 'http://127.0.0.1:8080'")
        import httpx

        root = base_url.rstrip("/").removesuffix("/v1")
        self.flavor: ServerFlavor = flavor
        self.model = model
        self.url = root + _ENDPOINTS[flavor]
        # llama-server closes an idle keep-alive connection after 5 s: drop ours before that
        self._client: httpx.Client = httpx.Client(
            timeout=timeout, limits=httpx.Limits(keepalive_expiry=2.0)
        )

    def _payload(self, text: str) -> dict[str, Any]:
        if self.flavor == "llama.cpp":
            return {"content": text}
        if self.flavor == "vllm":
            model = {"model": self.model} if self.model else {}
            return {**model, "prompt": text, "add_special_tokens": False}
        return {"input": text}

    def _tokenize_count(self, text: str) -> int:
        import httpx

        try:
            try:
                response = self._client.post(self.url, json=self._payload(text))
            except httpx.RemoteProtocolError:
                # a kept-alive connection the server closed just as it was reused: the request
                # never reached it, and counting is safe to ask again, once
                response = self._client.post(self.url, json=self._payload(text))
        except httpx.HTTPError as exc:
            raise TokenizeEndpointError(
                f"cannot reach the tokenize endpoint {self.url} ({exc!r}); is the {self.flavor} "
                "server running there?"
            ) from exc
        if response.status_code != 200:
            raise TokenizeEndpointError(
                f"the tokenize endpoint {self.url} answered HTTP {response.status_code}: "
                f"{response.text[:200]!r}; check the address and flavor={self.flavor!r}"
            )
        try:
            body = response.json()
            count = len(body["tokens"]) if self.flavor == "llama.cpp" else body["count"]
        except (ValueError, KeyError, TypeError) as exc:
            raise TokenizeEndpointError(
                f"the tokenize endpoint {self.url} answered {response.text[:200]!r}, which is not "
                f"a {self.flavor} tokenize reply; check flavor={self.flavor!r}"
            ) from exc
        if not isinstance(count, int) or isinstance(count, bool):
            raise TokenizeEndpointError(f"{self.url} gave a count that is not a whole number")
        return count

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ServerTokenCounter({self.url!r}, flavor={self.flavor!r})"
