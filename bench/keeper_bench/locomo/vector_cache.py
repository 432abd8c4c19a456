"""The recall command's vectors kept on disk (``--embed-cache``), so a lever sweep embeds once.

Embedding five conversations' turns and sentences costs minutes of CPU per model; a run that
only changes a keyword or fusion option needs the same vectors again. Each embedder's vectors go
to ``<folder>/<name>.pkl`` (text → vector, and query → vector), written after every method and
read before a method that uses that embedder. The file is the benchmark's own (pickle, not for
sharing); a method served from it reports no indexing rate, as with the in-memory reuse.
"""

from __future__ import annotations

import logging
import os
import pickle
from pathlib import Path

from keeper_bench.locomo.methods import CachedEmbedder, shared_embedder
from keeper_middleware.retrievers.embedders import Embedder

logger = logging.getLogger(__name__)


def load_cached_vectors(folder: Path, name: str, embedders: dict[str, Embedder]) -> None:
    """Preload the embedder ``name`` (made if not yet) with the vectors saved in ``folder``."""
    embedder = shared_embedder(name, embedders)
    path = folder / f"{name}.pkl"
    if isinstance(embedder, CachedEmbedder) and path.exists() and not embedder.saved()["texts"]:
        with path.open("rb") as file:
            embedder.preload(pickle.load(file))  # the benchmark's own file
        logger.info("%s: vectors read from %s", name, path)


def save_cached_vectors(folder: Path, embedders: dict[str, Embedder]) -> None:
    """Write every cached embedder's vectors to ``folder`` (atomically: a temp file of this
    process renamed, so runs side by side never write into one temp file)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, embedder in embedders.items():
        if isinstance(embedder, CachedEmbedder):
            path = folder / f"{name}.pkl"
            temporary = path.with_suffix(f".{os.getpid()}.tmp")
            with temporary.open("wb") as file:
                pickle.dump(embedder.saved(), file, protocol=pickle.HIGHEST_PROTOCOL)
            temporary.replace(path)
